"""AWS Neuron settings and device facts: options, the power table, the driver's power line.

Power (every figure is quality MODEL: a percentage of a nominal maximum is not a meter)::

    sysfs:  P = idle + avg% x max      bounds = idle + (min%, max%) x max
    model:  P = idle + u x (max - idle)  u = mean NeuronCore utilization (no bounds)

``idle`` is added to the sysfs figure because the driver backs background power out;
with ``add_background_power=False`` the figure is dynamic power only (channel info says
which). Whether the percentage is of ``max`` or of ``max - idle`` is not documented;
``avg% x max`` is used. The bounds are the union of the last two published minutes (a
reading interval can straddle a minute boundary); they cover the within-minute variation
only, not the uncertainty of the nominal max/idle figures. The value describes the last
completed minute, so it lags by about a minute. A non-VALID status, a malformed line, or
an epoch more than ``power_stale_s`` away from the wall clock is a reading error
("neuron0 power: NO_DATA"), never zero watts; a VALID 0.00 is a legitimate idle reading
(all-smi read exactly that on an idle trn1).

Device power table (watts per device; every value overridable in :class:`NeuronOptions`).
AWS publishes no per-chip power figure for any Neuron device, and the driver does not
say what its "maximum power" reference is.

================  ======  ======  ===========================================================
device type        max W   idle W  where the max figure comes from
================  ======  ======  ===========================================================
inferentia (inf1)    75      15    ASSUMPTION: a 2019 inference chip (64 FP16 TFLOPS, 8 GiB
                                   DRAM: AWS Inferentia docs) put in the class of the
                                   NVIDIA T4 (70 W). No public figure.
inferentia2 (inf2)  200      40    ASSUMPTION: same two NeuronCore-v2 and 32 GiB HBM as
                                   Trainium (AWS Inferentia2 docs), fewer device links.
trainium (trn1)     300      60    ASSUMPTION: 190 BF16 TFLOPS, 32 GiB HBM (AWS Trainium
                                   docs); no public power figure.
trainium2 (trn2)    500     100    SemiAnalysis, "Amazon's AI Self Sufficiency | Trainium2
                                   Architecture & Networking", as summarised in a news
                                   digest: "~500W chip". Third-party estimate, not AWS.
trainium3 (trn3)   1000     200    DatacenterDynamics report of AWS VP P. Kalyanaraman: the
                                   next Trainium "will require liquid cooling", needed
                                   "when a chip goes above 1,000 watts". Implied, not a spec.
================  ======  ======  ===========================================================

Every idle figure is an ASSUMPTION: 20 % of the max figure. NeuronCores per device
(fallback when the report does not say): inferentia 4, inferentia2 2, trainium 2 (AWS
architecture docs); trn2/trn3 numbering depends on the logical-core config, so only the
report's ``neuroncore_per_device_count`` is used there.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

#: Nominal maximum power per device type, W (sources and assumptions: module docstring).
DEVICE_MAX_POWER_W: Final[Mapping[str, float]] = {
    "inferentia": 75.0,
    "inferentia2": 200.0,
    "trainium": 300.0,
    "trainium2": 500.0,
    "trainium3": 1000.0,
}
#: Background (idle) power per device type, W: all assumptions (20 % of max).
DEVICE_IDLE_POWER_W: Final[Mapping[str, float]] = {k: v * 0.2 for k, v in DEVICE_MAX_POWER_W.items()}
#: NeuronCores per device where fixed (AWS architecture docs).
CORES_PER_DEVICE: Final[Mapping[str, int]] = {"inferentia": 4, "inferentia2": 2, "trainium": 2}

_RUNTIME_METRICS: Final = ("neuroncore_counters", "memory_used", "neuron_runtime_vcpu_usage", "execution_stats")
_SYSTEM_METRICS: Final = ("vcpu_usage", "memory_info", "neuron_hw_counters")
_FAMILIES: Final = {"inf1": "inferentia", "inf2": "inferentia2", "trn1": "trainium", "trn2": "trainium2"}


@dataclass(frozen=True, slots=True)
class NeuronOptions:
    """Configuration of :class:`NeuronSource`."""

    #: neuron-monitor executable: a name looked up on PATH (then /opt/aws/neuron/bin) or a
    #: path; None disables the child (sysfs power only).
    monitor_path: str | None = "neuron-monitor"
    #: Extra arguments after ``-c CONFIG``, and extra environment for the child.
    monitor_args: list[str] = field(default_factory=list)
    monitor_env: dict[str, str] = field(default_factory=dict)
    #: Where the agent writes the monitor config; None: a private temp dir removed on close.
    config_path: Path | None = None
    period_s: float = 1.0  #: neuron-monitor report period
    tag_filter: str = ".*"  #: neuron_runtimes[].tag_filter (regex on runtime tags)
    #: discover() waits this long for a first report (device count, type, core layout).
    startup_timeout_s: float = 5.0
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 60.0
    backoff_reset_s: float = 60.0  #: a child that lived this long resets the back-off
    terminate_timeout_s: float = 2.0  #: SIGTERM grace before SIGKILL on close()
    #: A report older than this is stale (utilization unknown); None: max(5 periods, 5 s).
    report_stale_s: float | None = None
    power_stale_s: float = 120.0  #: sysfs epoch older than this is a reading error
    #: Force the device type ("trainium2", "trn1", "inf2"); None: from report/sysfs/DMI.
    device_type: str | None = None
    #: Overrides merged over DEVICE_MAX_POWER_W / DEVICE_IDLE_POWER_W (keys as device_type).
    device_max_power_w: dict[str, float] = field(default_factory=dict)
    device_idle_power_w: dict[str, float] = field(default_factory=dict)
    cores_per_device: int | None = None  #: override of the report's count
    #: Add the idle figure to the sysfs power (which has background backed out).
    add_background_power: bool = True


@dataclass(frozen=True, slots=True)
class PowerStats:
    """One parsed line of the driver's ``stats/power/utilization`` file."""

    status: str  #: "VALID", "NO_DATA", "INVALID", ... (``POWER_STATUS_`` prefix removed)
    epoch_s: int
    min_pct: float
    max_pct: float
    avg_pct: float


@dataclass(frozen=True, slots=True)
class MonitorStatus:
    """State of the neuron-monitor child, for ``wattline sources`` and tests."""

    running: bool
    pid: int | None
    starts: int
    restarts: int
    last_exit: str  #: "exited with status 3: <last stderr line>", "" while none
    stderr_last_line: str
    reports: int  #: reports parsed since discover()
    bad_lines: int  #: malformed / truncated lines skipped
    report_errors: int  #: reports that carried an error field
    last_report_age_s: float | None


def normalize_device_type(name: str) -> str | None:
    """Canonical device type ("trainium2") from a type, family, device or instance name."""
    s = re.sub(r"[\s_-]", "", name.strip().lower()).removeprefix("aws").removeprefix("neuron")
    if m := re.match(r"(inf|trn)(\d)", s):
        family = m.group(1) + m.group(2)
        return _FAMILIES.get(family, f"trainium{m.group(2)}" if m.group(1) == "trn" else None)
    s = {"inferentia1": "inferentia", "trainium1": "trainium"}.get(s, s)
    return s if re.fullmatch(r"(inferentia|trainium)\d*", s) else None


def parse_power_line(text: str) -> PowerStats:
    """Parse ``<status>,<epoch_s>,<min>,<max>,<avg>``; ValueError when malformed."""
    parts = [p.strip() for p in text.strip().split(",")]
    if len(parts) != 5 or not parts[0]:
        raise ValueError(f"expected 5 fields, got {text.strip()[:80]!r}")
    status = parts[0].removeprefix("POWER_STATUS_")
    epoch = int(parts[1])
    lo, hi, avg = (float(p) for p in parts[2:])
    if not all(0.0 <= v <= 100.0 for v in (lo, hi, avg)):
        raise ValueError(f"percent out of range in {text.strip()[:80]!r}")
    return PowerStats(status, epoch, lo, hi, avg)


def _duration(seconds: float) -> str:
    return f"{int(seconds)}s" if seconds >= 1 and float(seconds).is_integer() else f"{max(round(seconds * 1000), 1)}ms"


def monitor_config(options: NeuronOptions) -> dict[str, object]:
    """The neuron-monitor config (shape of the documented example) the agent writes."""
    return {
        "period": _duration(options.period_s),
        "neuron_runtimes": [{"tag_filter": options.tag_filter, "metrics": [{"type": t} for t in _RUNTIME_METRICS]}],
        "system_metrics": [{"type": t} for t in _SYSTEM_METRICS],
    }
