"""CPU model source: power from utilization, psutil CPU-time deltas, standing down for RAPL."""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

import psutil
import pytest
from sysfs_trees import Zone, powercap_tree

from wattline.agent.counter import EnergyCounter
from wattline.agent.registry import SourceStatus, discover
from wattline.agent.sources.base import SourceUnavailable
from wattline.agent.sources.cpu_model import CpuModelSource, Options
from wattline.quality import Quality


class CpuTimes(NamedTuple):
    """The Linux field set of psutil.cpu_times()."""

    user: float = 0.0
    nice: float = 0.0
    system: float = 0.0
    idle: float = 0.0
    iowait: float = 0.0
    irq: float = 0.0
    softirq: float = 0.0
    steal: float = 0.0
    guest: float = 0.0
    guest_nice: float = 0.0


class Utilization:
    def __init__(self, *values: float) -> None:
        self.values = list(values)

    def __call__(self) -> float:
        return self.values.pop(0)


def test_power_is_idle_plus_share_of_tdp() -> None:
    src = CpuModelSource(options=Options(tdp_w=100.0, idle_w=20.0), utilization=Utilization(0.25, 1.5, -0.2, 0.0))
    (channel,) = src.discover()
    assert (channel.source, channel.component, channel.device) == ("cpu_model", "cpu", "host")
    assert channel.quality is Quality.MODEL and channel.max_power_w == 100.0
    readings = [src.read()[0] for _ in range(4)]
    assert [(r.power_w, r.utilization) for r in readings] == [(40.0, 0.25), (100.0, 1.0), (20.0, 0.0), (20.0, 0.0)]
    assert readings[0].energy_raw is None and readings[0].energy_j is None
    assert any(n.level == "warning" and "model, not a measurement" in n.text for n in src.notes)


def test_default_tdp_and_idle_fraction(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    src = CpuModelSource(utilization=Utilization(0.5))
    src.discover()
    assert src.tdp_w == 32.0 and src.idle_w == pytest.approx(9.6)
    assert src.read()[0].power_w == pytest.approx(9.6 + (32.0 - 9.6) * 0.5)
    src = CpuModelSource(options=Options(tdp_w=200.0, idle_w_fraction=0.1), utilization=Utilization(0.0))
    src.discover()
    assert src.idle_w == pytest.approx(20.0)


def test_idle_above_tdp_is_refused() -> None:
    with pytest.raises(SourceUnavailable, match=r"idle_w 150\.0 W must be between 0 and tdp_w 100\.0 W"):
        CpuModelSource(options=Options(tdp_w=100.0, idle_w=150.0)).discover()


def test_psutil_cpu_time_deltas(monkeypatch: pytest.MonkeyPatch) -> None:
    samples = [
        CpuTimes(user=100, system=50, idle=800, iowait=50),  # discover(): the baseline
        # +60 user (of which 20 guest: already inside user), +20 system, +100 idle, +20 steal
        CpuTimes(user=160, system=70, idle=900, iowait=50, steal=20, guest=20),
        CpuTimes(user=160, system=70, idle=900, iowait=50, steal=20, guest=20),  # no tick passed
        CpuTimes(user=160, system=70, idle=1100, iowait=50, steal=20, guest=20),  # all idle
    ]
    monkeypatch.setattr(psutil, "cpu_times", lambda: samples.pop(0))
    src = CpuModelSource(options=Options(tdp_w=100.0, idle_w=0.0))
    src.discover()
    utils = [src.read()[0].utilization for _ in range(3)]
    assert utils == [pytest.approx(80 / 200), pytest.approx(80 / 200), 0.0]
    assert not samples


def test_live_psutil_utilization_is_a_fraction() -> None:
    src = CpuModelSource(options=Options(tdp_w=50.0, idle_w=10.0))
    src.discover()
    sum(i * i for i in range(200_000))  # some CPU time between the reads
    (reading,) = src.read()
    assert reading.utilization is not None and 0.0 <= reading.utilization <= 1.0
    assert reading.power_w == pytest.approx(10.0 + 40.0 * reading.utilization)


def test_cpu_times_failure_is_an_error_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    src = CpuModelSource(options=Options(tdp_w=100.0, idle_w=10.0))
    src.discover()

    def broken() -> CpuTimes:
        raise OSError("no /proc/stat")

    monkeypatch.setattr(psutil, "cpu_times", broken)
    assert src.read()[0].error == "cannot read CPU times: no /proc/stat"


def test_counter_integrates_the_modeled_power() -> None:
    src = CpuModelSource(options=Options(tdp_w=100.0, idle_w=20.0), utilization=Utilization(0.0, 0.5, 1.0))
    (channel,) = src.discover()
    counter = EnergyCounter(channel)
    energies = []
    for t in (0.0, 2.0, 3.0):
        delta = counter.update(src.read()[0], t)
        energies.append(None if delta is None else delta.energy_j)
    assert energies == [None, pytest.approx((20.0 + 60.0) / 2 * 2), pytest.approx((60.0 + 100.0) / 2)]


def test_registry_stands_the_model_down_after_rapl_found_packages(tmp_path: Path) -> None:
    powercap_tree(tmp_path, [Zone("intel-rapl:0", "package-0", 1)])
    rapl_status, model_status = discover(["rapl", "cpu_model"], tmp_path, env={})
    assert rapl_status.available and not model_status.available
    assert model_status.reason == "RAPL present: measured CPU energy is used instead"
    assert rapl_status.source is not None
    rapl_status.source.close()
    (model_only,) = discover(["cpu_model"], tmp_path, env={})
    assert model_only.available


def test_a_running_model_stands_down_when_rapl_appears(tmp_path: Path) -> None:
    (model,) = discover(["rapl", "cpu_model"], tmp_path, env={})[1:]
    assert model.available and model.source is not None
    closed: list[bool] = []
    model.source.close = lambda: closed.append(True)  # type: ignore[method-assign]
    powercap_tree(tmp_path, [Zone("intel-rapl:0", "package-0", 1)])
    rapl_status, again = discover(["rapl", "cpu_model"], tmp_path, env={}, current=[model])
    assert not again.available and again.reason.startswith("RAPL present") and closed == [True]
    assert rapl_status.source is not None
    rapl_status.source.close()


def test_an_old_config_naming_rapl_present_warns_once_and_runs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The retired option (the agent decides) is ignored with one warning line, not refused:
    an upgraded agent with its old config still starts."""
    doc = {"sources": {"cpu_model": {"rapl_present": True, "tdp_w": 80.0}}}
    (status,) = discover(["cpu_model"], tmp_path, doc, env={})
    assert status.available and status.channels[0].max_power_w == 80.0  # the other options still apply
    (line,) = [r.getMessage() for r in caplog.records if "rapl_present" in r.getMessage()]
    assert line.startswith("config [sources.cpu_model]: option 'rapl_present' is retired and ignored")
    assert status.source is not None
    discover(["cpu_model"], tmp_path, doc, env={}, current=[SourceStatus("nic", None)])  # a rediscovery
    assert len([r for r in caplog.records if "rapl_present" in r.getMessage()]) == 1
    status.source.close()


def test_psutil_is_not_imported_where_rapl_measures_the_cpu(tmp_path: Path) -> None:
    """The agent's resident memory: psutil (~2.7 MiB) loads only when the model actually runs."""
    import subprocess
    import sys

    powercap_tree(tmp_path, [Zone("intel-rapl:0", "package-0", 1000)])
    code = (
        "import sys; from pathlib import Path; from wattline.agent.registry import SourceStatus, discover; "
        f"s = discover(['rapl', 'cpu_model'], Path({str(tmp_path)!r}), env={{}}); "
        "assert [x.available for x in s] == [True, False], s; print('psutil' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr
