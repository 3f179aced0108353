"""What a job's report holds: its settings and the report itself (built by
:func:`.build.build_report`; each window's energy: :mod:`.windows`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from wattline.accounting.device_shares import DeviceShare
from wattline.accounting.saturation import Saturation, SaturationParams
from wattline.jobs.jobs_view import JobView, UnitSeries
from wattline.reports import economics
from wattline.reports.intensity import IntensitySeries
from wattline.reports.window_view import Window
from wattline.reports.windows import WindowEnergy
from wattline.share_rules import DEFAULT_SHARE_RULE

if TYPE_CHECKING:
    from wattline.reports.intervals import Intervals
    from wattline.reports.latency import Latency


#: The rule that splits a job's energy between its models unless asked otherwise
#: (:data:`wattline.reports.model_split.AUTO`; that module names each rule).
DEFAULT_MODEL_SPLIT = "auto"


@dataclass(frozen=True)
class ReportSettings:
    """Knobs of a report (prices, carbon, idle and sharing policy)."""

    price_per_instance_hour: float | None = None
    carbon_intensity: float | None = None
    pue: float = 1.0
    idle: str = "none"  #: none | subtract
    idle_lookback_s: float = 60.0  #: idle baseline measured over this long before the job
    #: How host-wide energy is split between jobs (:mod:`wattline.share_rules`).
    share_rule: str = DEFAULT_SHARE_RULE
    deviceless_fraction: float = 0.1
    #: NeuronCores per device where a host's samples do not say (older agents; see :mod:`.channels`).
    cores_per_neuron_device: int = 2
    saturation: SaturationParams = field(default_factory=SaturationParams)
    #: Carbon intensity over time (a CSV file: :mod:`.intensity`), applied interval by interval (:mod:`.carbon`).
    carbon_series: IntensitySeries | None = None
    #: Figures over this stretch of the job only (a service's last 15 minutes), not its whole run.
    window: Window | None = None
    #: With a window: take a service's stored intervals inside it where they match this policy
    #: (:mod:`.stored_intervals`); False computes every figure from raw samples (``--raw``).
    from_stored: bool = False
    #: How the energy divides between the models of its unit series (:mod:`.model_split`).
    model_split: str = DEFAULT_MODEL_SPLIT


@dataclass
class Report:
    """Everything ``wattline report`` prints."""

    job: JobView
    end_ns: int
    saturation: Saturation
    saturated_from_ns: int
    units_warmup: float
    units_saturated: float
    warmup: WindowEnergy
    #: From saturation to the end (the whole job when never saturated).
    saturated_window: WindowEnergy
    figures: economics.Figures
    settings: ReportSettings
    missing: list[str]
    notes: list[str]
    #: Hosts whose samples do not (yet) reach their close: host -> samples up to (ns).
    incomplete: dict[str, int] = field(default_factory=dict)
    #: Hosts whose samples begin after their open: host -> samples only from (ns).
    late_start: dict[str, int] = field(default_factory=dict)
    state: str = "closed"  #: closed | running | abandoned (see JobView.state)
    #: With ``idle="subtract"``: host -> the other jobs that ran in its idle baseline's look-back.
    idle_busy: dict[str, list[str]] = field(default_factory=dict)
    #: The job's charge per accelerator: share by use or claimed (:mod:`wattline.accounting.device_shares`).
    device_shares: list[DeviceShare] = field(default_factory=list)
    #: The other jobs that shared one of its hosts during its window (their windows
    #: changing after the fact changes these figures).
    shared_with: list[str] = field(default_factory=list)
    #: When one of those that still ran would be abandoned if not heard again; None if none runs.
    depends_until_ns: int | None = None
    #: With a window asked: how far its units may be off (units done where at its edges is not known).
    units_bound: float = 0.0
    #: With a window asked: the same, per extra unit kind's series (:mod:`.unit_kinds`).
    kind_bounds: dict[UnitSeries, float] = field(default_factory=dict)
    #: With ``--every``: its span interval by interval (:mod:`.intervals`).
    intervals: Intervals | None = None
    #: The server's latency histograms over the span (:mod:`.latency`).
    latencies: list[Latency] = field(default_factory=list)

    @property
    def saturated(self) -> bool:
        return self.saturation.saturated

    @property
    def complete(self) -> bool:
        """Every host's open is stored and its samples cover its window, from its open to its close."""
        return not self.incomplete and not self.late_start and not self.job.missing_events

    @property
    def energy_data(self) -> bool:
        """Any energy sample of the job's hosts fell in its window: without one, its energy
        figures are "no samples", not 0 J."""
        return bool(self.saturated_window.components or self.warmup.components)
