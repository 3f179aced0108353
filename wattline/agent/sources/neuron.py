"""AWS Neuron (Inferentia / Trainium) source: ``neuron-monitor`` + driver power sysfs.

Two inputs, both optional, at least one required:

- **neuron-monitor** runs as a child process with a config file the agent writes. A
  background thread reads its stdout (one JSON report per line, parsed by
  :mod:`.neuron_parse`) and keeps only the latest report, so :meth:`NeuronSource.read`
  never blocks. If the child exits it is restarted with exponential back-off
  (``backoff_initial_s`` doubling to ``backoff_max_s``, back to the start after a child
  lived ``backoff_reset_s``). Its stderr is drained continuously; the last line is kept
  for error messages. :meth:`NeuronSource.close` terminates, waits, kills, and reaps it.
- **Driver power file** ``/sys/devices/virtual/neuron_device/neuronN/stats/power/utilization``
  (driver 2.21.37+), ``<status>,<epoch_s>,<min>,<max>,<avg>``: the minimum, maximum and
  average power of the last completed wall-clock minute, in percent of the device's
  maximum power *with background power backed out* (driver ``neuron_power.c``). Status is
  ``POWER_STATUS_VALID``, ``POWER_STATUS_NO_DATA`` (fewer than 60 samples in the minute;
  then all values are 0.00) or ``POWER_STATUS_INVALID`` (``POWER_STATUS_MAX`` is the
  driver's clamp for an out-of-range status). Driver 2.31 moved sysfs nodes, so the file
  is searched for under each device directory and the layout found is reported as a note.

Power (the formulas, the device power table and where each figure comes from) is in
:mod:`.neuron_config`; finding and reading the driver power file in :mod:`.neuron_power`;
what is kept of the reports as they arrive in :mod:`.neuron_feed`; a device's type, power
figures and NeuronCores in :mod:`.neuron_devices`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, Final

from wattline.agent.sources.base import Channel, Note, Reading, Source, SourceUnavailable
from wattline.agent.sources.neuron_config import (
    CORES_PER_DEVICE,
    DEVICE_IDLE_POWER_W,
    DEVICE_MAX_POWER_W,
    MonitorStatus,
    NeuronOptions,
    PowerStats,
    monitor_config,
    normalize_device_type,
    parse_power_line,
)
from wattline.agent.sources.neuron_devices import (
    cores_per_device,
    device_type,
    idle_power_w,
    largest_max_power_w,
    max_power_w,
    sysfs_device_type,
)
from wattline.agent.sources.neuron_feed import ReportFeed
from wattline.agent.sources.neuron_monitor import Supervisor
from wattline.agent.sources.neuron_power import DevicePower, find_power_file, model_power
from wattline.agent.sources.neuron_report import NeuronReport
from wattline.agent.sources.sysfs import read_attr
from wattline.agent.sources.use import DeviceUse
from wattline.quality import Quality

__all__ = [
    "CORES_PER_DEVICE",
    "DEVICE_IDLE_POWER_W",
    "DEVICE_MAX_POWER_W",
    "MonitorStatus",
    "NeuronOptions",
    "NeuronSource",
    "PowerStats",
    "monitor_config",
    "normalize_device_type",
    "parse_power_line",
]

log = logging.getLogger(__name__)

SYSFS_DIR: Final = "/sys/devices/virtual/neuron_device"
_CLASS_DIR: Final = "/sys/class/neuron_device"
_DMI_PRODUCT: Final = "/sys/devices/virtual/dmi/id/product_name"
_DEFAULT_BIN_DIR: Final = "/opt/aws/neuron/bin"  # not on PATH under systemd/sudo
_MAX_REPORT_NOTES: Final = 20


class NeuronSource(Source):
    """One channel per Neuron device: power (MODEL), utilization and gauges."""

    name = "neuron"

    def __init__(
        self,
        root: Path = Path("/"),
        options: NeuronOptions | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(root)
        self.options = options or NeuronOptions()
        self._clock = clock  # wall clock, compared with the sysfs epoch
        self._feed = ReportFeed()
        self._monitor: Supervisor | None = None
        self._tmpdir: Path | None = None
        self._noted_errors: set[str] = set()
        self._devices: list[int] = []
        self._channels: list[Channel] = []
        self._power_files: dict[int, Path | None] = {}
        self._power_hist: dict[int, DevicePower] = {}
        self._sysfs_type: str | None = None
        self._dmi_instance_type = ""

    # -- discovery -------------------------------------------------------------------

    def discover(self) -> list[Channel]:
        # Called again (a rediscovery): a running neuron-monitor is kept (its supervisor restarts it).
        self.notes = []
        sys_dir = self.path(SYSFS_DIR)
        sys_devices = sorted(
            int(m.group(1)) for p in _listdir(sys_dir) if (m := re.fullmatch(r"neuron(\d+)", p.name)) and p.is_dir()
        )
        binary = self._find_monitor()
        if not sys_devices and binary is None:
            raise SourceUnavailable(
                "no Neuron devices (no /sys/devices/virtual/neuron_device) and neuron-monitor not found"
            )
        self._read_static_sysfs(sys_dir, sys_devices)
        if binary is None:
            if self.options.monitor_path:
                self._note("warning", f"{self.options.monitor_path} not found: no utilization, memory or ECC figures")
        else:
            if self._monitor is None:
                self._feed.first_report.clear()
                self._start_monitor(binary)
                reported = self._wait_first_report(self.options.startup_timeout_s)
            else:
                reported = self._feed.first_report.is_set()  # never wait on a rediscovery: sampling waits meanwhile
            if not reported:
                why = f"neuron-monitor gave no report within {self.options.startup_timeout_s:g} s"
                if self._monitor is not None and self._monitor.last_exit:
                    why += f" ({self._monitor.last_exit})"
                elif self._monitor is not None and self._monitor.stderr_last:
                    why += f" ({self._monitor.stderr_last})"
                if not sys_devices:
                    self.close()
                    raise SourceUnavailable(why)
                self._note("warning", why)
        devices = sys_devices
        hardware = self._feed.hardware
        count = hardware.device_count if hardware else None
        if not devices:
            if not count:
                self.close()
                raise SourceUnavailable("neuron-monitor reports no Neuron devices")
            devices = list(range(count))
        elif count is not None and count != len(devices):
            self._note("warning", f"neuron-monitor reports {count} devices, sysfs has {len(devices)}")
        self._devices = devices
        self._channels = [self._channel(d, sys_dir) for d in devices]
        return list(self._channels)

    def _wait_first_report(self, timeout: float) -> bool:
        """Wait for a first report; give up early once the child exited without one."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if self._feed.first_report.wait(min(left, 0.05)):
                return True
            if self._monitor is not None and self._monitor.last_exit:
                return self._feed.first_report.is_set()
        return self._feed.first_report.is_set()

    def _find_monitor(self) -> str | None:
        name = self.options.monitor_path
        if not name:
            return None
        found = shutil.which(name)
        if found is None and os.sep not in name:
            found = shutil.which(name, path=_DEFAULT_BIN_DIR)
        return found

    def _read_static_sysfs(self, sys_dir: Path, devices: list[int]) -> None:
        self._dmi_instance_type = read_attr(self.path(_DMI_PRODUCT))
        self._sysfs_type = sysfs_device_type(sys_dir, devices) or self._sysfs_type

    def _start_monitor(self, binary: str) -> None:
        opts = self.options
        if opts.config_path is not None:
            config = opts.config_path
            config.parent.mkdir(parents=True, exist_ok=True)
        else:
            self._tmpdir = Path(tempfile.mkdtemp(prefix="wattline-neuron-"))
            config = self._tmpdir / "monitor.conf.json"
        tmp = config.with_name(config.name + ".tmp")
        tmp.write_text(json.dumps(monitor_config(opts), indent=2) + "\n")
        tmp.replace(config)
        argv = [binary, "-c", str(config), *opts.monitor_args]
        self._monitor = Supervisor(argv, opts.monitor_env, self._feed.on_line, opts)
        self._monitor.start()

    def _channel(self, dev: int, sys_dir: Path) -> Channel:
        power_file, layout = find_power_file(sys_dir / f"neuron{dev}", self.path(_CLASS_DIR) / f"neuron{dev}")
        self._power_files[dev] = power_file
        dtype = self._device_type()
        max_w = max_power_w(self.options, dtype)
        if max_w is None:
            max_w = largest_max_power_w(self.options)
        if dev == self._devices[0]:
            kind = dtype or "unknown (plausibility bound from the largest table value)"
            self._note("info", f"neuron power: {layout}; device type {kind}")
        info: list[tuple[str, str]] = [("device_type", dtype or "unknown"), ("power_source", layout)]
        if power_file is not None:
            info.append(
                ("power_scope", "total (idle assumed)" if self.options.add_background_power else "dynamic only")
            )
        return Channel(
            source=self.name,
            component="accelerator",
            device=f"neuron{dev}",
            quality=Quality.MODEL,
            max_power_w=max_w * 1.2,
            info=tuple(info),
        )

    # -- reading ---------------------------------------------------------------------

    def read(self) -> list[Reading]:
        report, age, errors = self._feed.take()
        for err in errors:
            if err not in self._noted_errors and len(self._noted_errors) < _MAX_REPORT_NOTES:
                self._noted_errors.add(err)
                self._note("warning", f"neuron-monitor report error: {err}")
                log.warning("neuron-monitor report error: %s", err)
        stale = self.options.report_stale_s or max(5.0 * self.options.period_s, 5.0)
        fresh = report if report is not None and age <= stale else None
        why = self._no_report_reason(report, age)
        dtype = self._device_type()
        hardware = self._feed.hardware
        cores = cores_per_device(self.options, hardware, dtype)
        count = (hardware.device_count if hardware else None) or len(self._devices)
        now = self._clock()
        out: list[Reading] = []
        mem_total = hardware.device_memory_bytes if hardware else None
        for ch, dev in zip(self._channels, self._devices, strict=True):
            stats = fresh.device_stats(dev, cores, count) if fresh is not None else None
            reading = Reading(channel=ch, utilization=stats.utilization if stats else None)
            if cores:  # stored with the samples: reports map neuroncore claims to devices by it
                reading.gauges["neuroncores_per_device"] = float(cores)
            if stats is not None:
                reading.gauges.update(stats.gauges())
                if mem_total is not None:
                    reading.gauges["memory_total_bytes"] = float(mem_total)
            if stats is not None and stats.utilization is None and why is None:
                why = "core-to-device map unknown" if not cores else "a runtime's NeuronCore counters are missing"
            self._power(reading, dev, dtype, now, why)
            out.append(reading)
        return out

    def _power(self, reading: Reading, dev: int, dtype: str | None, now: float, why: str | None) -> None:
        name = f"neuron{dev}"
        max_w = max_power_w(self.options, dtype)
        idle_w = idle_power_w(self.options, dtype)
        path = self._power_files.get(dev)
        if path is not None:
            self._power_hist.setdefault(dev, DevicePower(name)).read(reading, path, max_w, idle_w, now, self.options)
            return
        model_power(reading, name, max_w, idle_w, why)

    def _no_report_reason(self, report: NeuronReport | None, age: float) -> str | None:
        mon = self._monitor
        if mon is None:
            return "neuron-monitor not running"
        if report is None:
            return f"no report yet{f'; {mon.last_exit}' if mon.last_exit else ''}"
        stale = self.options.report_stale_s or max(5.0 * self.options.period_s, 5.0)
        if age > stale:
            return f"last report {age:.1f} s old{f'; {mon.last_exit}' if mon.last_exit else ''}"
        return None

    def _device_type(self) -> str | None:
        feed = self._feed
        return device_type(self.options, feed.hardware, feed.instance, self._sysfs_type, self._dmi_instance_type)

    # -- public extras ---------------------------------------------------------------

    def host_labels(self) -> dict[str, str]:
        """Labels for the host: instance type, zone, region, Neuron device type."""
        with self._feed.lock:
            inst = self._feed.instance
        labels: dict[str, str] = {}
        if inst is not None:
            labels = {
                "instance_type": inst.instance_type,
                "availability_zone": inst.availability_zone,
                "region": inst.region,
            }
        elif self._dmi_instance_type:
            labels["instance_type"] = self._dmi_instance_type
        if dtype := self._device_type():
            labels["neuron_device_type"] = dtype
        return {k: v for k, v in labels.items() if v}

    def process_use(self, since_us: int | None = None) -> list[DeviceUse]:
        """Each device's per-runtime (pid) use since the previous call: a runtime's mean
        NeuronCore utilization over the reports since then, summed over its cores on the
        device and divided by the device's cores (percent of the device). Running: the
        runtimes of the latest report on the device. Empty without a core-to-device map.
        ``since_us`` (any value) only drops what was summed so far: reports carry no time."""
        cores = cores_per_device(self.options, self._feed.hardware, self._device_type())
        sums, reports, latest = self._feed.take_use()
        if not cores or since_us is not None or reports == 0:
            return []  # (no report since the previous call: nothing known, not idle)
        out = []
        for dev in self._devices:
            on_dev = range(dev * cores, (dev + 1) * cores)
            use: dict[int, float] = {}
            for (pid, core), total in sums.items():
                if core in on_dev and total > 0:
                    use[pid] = use.get(pid, 0.0) + total / reports / cores
            running = frozenset(
                rt.pid
                for rt in (latest.runtimes if latest is not None else ())
                if rt.pid is not None and any(c in on_dev for c in rt.cores)
            )
            out.append(DeviceUse("accelerator", f"neuron{dev}", "neuroncore", running, use))
        return out

    def details(self) -> dict[str, Any]:
        """``monitor``: where the neuron-monitor child stands (:meth:`monitor_status`)."""
        return {"monitor": asdict(self.monitor_status())}

    def monitor_status(self) -> MonitorStatus:
        """Where the neuron-monitor child stands."""
        mon = self._monitor
        feed = self._feed
        with feed.lock:
            age = time.monotonic() - feed.latest_t if feed.latest is not None else None
            reports, bad, errs = feed.reports, feed.bad_lines, feed.report_errors
        return MonitorStatus(
            running=mon is not None and mon.pid is not None,
            pid=mon.pid if mon else None,
            starts=mon.starts if mon else 0,
            restarts=max((mon.starts if mon else 0) - 1, 0),
            last_exit=mon.last_exit if mon else "",
            stderr_last_line=mon.stderr_last if mon else "",
            reports=reports,
            bad_lines=bad,
            report_errors=errs,
            last_report_age_s=age,
        )

    def close(self) -> None:
        if self._monitor is not None:
            self._monitor.stop()
            self._monitor = None
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    def _note(self, level: str, text: str) -> None:
        self.notes.append(Note(level, text))


def _listdir(path: Path) -> list[Path]:
    try:
        return list(path.iterdir())
    except OSError:
        return []
