"""Energy arithmetic: a window's joules from counters and samples (:mod:`.window_energy`,
:mod:`.streams`), how far they may be off (:mod:`.window_bounds`, :mod:`.uncertainty`), the
saturated window (:mod:`.saturation`), a host's energy attributed to its jobs
(:mod:`.attribution`) and a shared accelerator split among them (:mod:`.device_shares`)."""
