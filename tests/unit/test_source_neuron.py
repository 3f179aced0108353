"""Neuron source: recorded neuron-monitor reports, a replayed child process, sysfs power."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from waits import wait_until

from wattline.agent.counter import EnergyCounter
from wattline.agent.sources.base import Channel, SourceUnavailable
from wattline.agent.sources.neuron import (
    DEVICE_IDLE_POWER_W,
    DEVICE_MAX_POWER_W,
    NeuronOptions,
    NeuronSource,
    monitor_config,
    normalize_device_type,
    parse_power_line,
)
from wattline.agent.sources.neuron_parse import ReportError, parse_report, parse_report_obj
from wattline.quality import Quality

HERE = Path(__file__).resolve().parents[1]  # tests/
FIX = HERE / "fixtures" / "neuron"
REPLAY = HERE / "helpers" / "neuron_replay.py"
STREAM = FIX / "trn1.2xlarge_wandb_stream.ndjson"
LINES = STREAM.read_text().splitlines()
NOW = 1_700_000_100.0  # fixed wall clock for the sysfs tests
U0 = 1.3631567613356375  # report 1, NeuronCore 0 utilization (%)


def fragment(name: str) -> dict[str, Any]:
    return dict(json.loads((FIX / f"docs_fragment_{name}.json").read_text()))


def gone(pid: int) -> bool:
    """True when the process no longer exists (reaped: a zombie still accepts signal 0)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


# -- parsing: recorded (older) shape -----------------------------------------------------


@contextlib.contextmanager
def monitor_stopped(src: NeuronSource) -> Iterator[None]:
    """The source's neuron-monitor child stopped (SIGSTOP): it writes nothing until continued."""
    pid = src.monitor_status().pid
    assert pid
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def test_recorded_stream_parses_every_field() -> None:
    reports = [parse_report(line) for line in LINES]
    r = reports[0]
    assert r.instance is not None and r.instance.instance_type == "trn1.2xlarge"
    assert r.instance.availability_zone == "us-west-2d" and r.instance.region == "us-west-2"
    assert r.hardware is not None
    assert (r.hardware.device_count, r.hardware.cores_per_device, r.hardware.device_type) == (1, 2, None)
    (rt,) = r.runtimes
    assert (rt.pid, rt.tag, rt.error) == (1337, "1337", "")
    assert rt.core_utilization_pct == {0: U0, 1: 0.0}
    assert rt.core_flops == {}  # older schema: no flops
    assert rt.core_memory_bytes == {0: 196608 + 101125344 + 943608, 1: 32768}
    assert (rt.host_memory_bytes, rt.device_memory_bytes) == (610705408, 102298328)
    assert rt.model_devices == frozenset({0})
    assert rt.execution is not None
    assert (rt.execution.completed, rt.execution.error_count) == (260, 23654)
    assert rt.execution.total_latency_s["p50"] == 0.000095367431640625
    assert r.hw_counters[0].counts == {
        "mem_ecc_corrected": 0,
        "mem_ecc_uncorrected": 0,
        "sram_ecc_uncorrected": 0,
        "sram_ecc_corrected": 0,
    }
    assert r.errors == ()
    assert [x.runtimes[0].pid for x in reports] == [1337, 16851, 16851]


def test_recorded_device_stats() -> None:
    stats = parse_report(LINES[0]).device_stats(0, cores_per_device=2, device_count=1)
    assert stats.utilization == pytest.approx(U0 / 2 / 100)
    assert stats.memory_used_bytes == 102298328
    assert stats.host_memory_used_bytes == 610705408
    assert (stats.executions_completed, stats.execution_errors, stats.runtimes) == (260, 23654, 1)
    assert stats.latency_p99_s == 0.00013184547424316406
    assert stats.ecc == {
        "mem_ecc_corrected": 0,
        "mem_ecc_uncorrected": 0,
        "sram_ecc_uncorrected": 0,
        "sram_ecc_corrected": 0,
    }
    # Unknown core layout: no utilization rather than a guess.
    assert parse_report(LINES[0]).device_stats(0, None, 1).utilization is None


# -- parsing: newer shape (docs fragments) ----------------------------------------------


def newer_report(flops_key: str) -> dict[str, Any]:
    counters = {
        "period": 1.000113182,
        "neuroncores_in_use": {
            "0": {"neuroncore_utilization": 42.01, flops_key: 1234567891011, "v3d": {"nc_v3.0": {}}},
            "1": {"neuroncore_utilization": 42.02, flops_key: 1234567891021},
            "5": {"neuroncore_utilization": 80.0, flops_key: 1000},
        },
        "error": "",
    }
    return {
        "neuron_runtime_data": [
            {
                "pid": 7,
                "neuron_runtime_tag": "my_app_1",
                "error": "",
                "report": {"neuroncore_counters": counters, **fragment("execution_stats")},
            }
        ],
        "system_data": {**fragment("neuron_hw_counters"), **fragment("memory_info")},
        **fragment("instance_info"),
        **fragment("neuron_hardware_info"),
    }


@pytest.mark.parametrize("flops_key", ["flops", "effective_flops"])
def test_newer_shape_parses(flops_key: str) -> None:
    r = parse_report_obj(newer_report(flops_key))
    hw = r.hardware
    assert hw is not None
    assert (hw.device_type, hw.device_count, hw.cores_per_device) == ("trainium2", 16, 4)
    assert hw.device_memory_bytes == 103079215104
    assert r.instance is not None and r.instance.instance_type == "trn2n.48xlarge"
    assert r.runtimes[0].core_flops == {0: 1234567891011, 1: 1234567891021, 5: 1000}
    d0 = r.device_stats(0, 4, 16)
    assert d0.utilization == pytest.approx((42.01 + 42.02) / 4 / 100)
    assert d0.flops_per_s == 1234567891011 + 1234567891021
    d1 = r.device_stats(1, 4, 16)
    assert d1.utilization == pytest.approx(0.2) and d1.flops_per_s == 1000
    # The runtime uses devices 0 and 1: its execution counts show on both, not on 2.
    assert d0.executions_completed == d1.executions_completed == 123
    assert r.device_stats(2, 4, 16).executions_completed is None
    assert r.device_stats(2, 4, 16).utilization == 0.0


def test_multi_runtime_memory_and_shared_core() -> None:
    def runtime(pid: int, cores: dict[str, float], mem: dict[str, int]) -> dict[str, Any]:
        usage = {k: {"tensors": v} for k, v in mem.items()}
        return {
            "pid": pid,
            "error": "",
            "report": {
                "neuroncore_counters": {
                    "neuroncores_in_use": {k: {"neuroncore_utilization": v} for k, v in cores.items()},
                    "error": "",
                },
                "memory_used": {
                    "neuron_runtime_used_bytes": {
                        "host": 10,
                        "neuron_device": sum(mem.values()),
                        "usage_breakdown": {"neuroncore_memory_usage": usage},
                    },
                    "error": "",
                },
            },
        }

    r = parse_report_obj(
        {
            "neuron_runtime_data": [
                runtime(1, {"0": 70.0, "3": 10.0}, {"0": 100, "3": 5}),
                runtime(2, {"0": 50.0}, {"0": 7}),
            ]
        }
    )
    assert r.core_utilization_pct() == {0: 100.0, 3: 10.0}  # time-shared core capped at 100 %
    d0, d1 = r.device_stats(0, 2, 2), r.device_stats(1, 2, 2)
    assert d0.utilization == pytest.approx(0.5) and d1.utilization == pytest.approx(0.05)
    assert (d0.memory_used_bytes, d1.memory_used_bytes) == (107, 5)
    assert (d0.host_memory_used_bytes, d1.host_memory_used_bytes, d0.runtimes) == (20, 10, 2)


def test_error_fields_are_collected_not_raised() -> None:
    obj = json.loads(LINES[1])
    obj["error"] = "top"
    obj["neuron_runtime_data"][0]["error"] = "rt gone"
    obj["neuron_runtime_data"][0]["report"]["neuroncore_counters"]["error"] = "counters failed"
    obj["system_data"]["vcpu_usage"]["error"] = "no proc"
    obj["instance_info"]["error"] = "imds timeout"
    r = parse_report_obj(obj)
    assert r.errors == (
        "neuron-monitor: top",
        "runtime 16851: rt gone",
        "runtime 16851 neuroncore_counters: counters failed",
        "vcpu_usage: no proc",
        "instance_info: imds timeout",
    )
    assert not r.counters_known
    assert r.device_stats(0, 2, 1).utilization is None  # unknown, not 0
    assert r.device_stats(0, 2, 1).memory_used_bytes == 101876188  # the rest still parses


@pytest.mark.parametrize(
    "line", ["this is not json {", LINES[0][: len(LINES[0]) // 2], "[1, 2]", "", '"text"', b"\xff\xfe{"]
)
def test_malformed_lines_raise_report_error(line: str | bytes) -> None:
    with pytest.raises(ReportError):
        parse_report(line)


def test_wrong_types_read_as_absent() -> None:
    r = parse_report_obj(
        {
            "error": 5,
            "neuron_runtime_data": [
                "x",
                {
                    "pid": "abc",
                    "report": {
                        "neuroncore_counters": {"neuroncores_in_use": {"0": {"neuroncore_utilization": "hi"}, "x": {}}},
                        "execution_stats": {"execution_summary": {"completed": True}, "latency_stats": []},
                        "memory_used": {"neuron_runtime_used_bytes": {"host": 1.5}},
                    },
                },
            ],
            "system_data": {"neuron_hw_counters": {"neuron_devices": [{"neuron_device_index": "0"}, 3]}},
            "neuron_hardware_info": {"neuron_device_count": "1"},
        }
    )
    (rt,) = r.runtimes
    assert rt.pid is None and rt.core_utilization_pct == {} and rt.host_memory_bytes is None
    assert rt.execution is not None and rt.execution.completed == 0
    assert r.hw_counters == {} and r.hardware is not None and r.hardware.device_count is None


# -- power file and device types ---------------------------------------------------------


def test_parse_power_line() -> None:
    assert parse_power_line("POWER_STATUS_VALID,1700000040,0.86,25.00,18.86\n").status == "VALID"
    p = parse_power_line("POWER_STATUS_NO_DATA,0,0.00,0.00,0.00")
    assert (p.status, p.epoch_s, p.min_pct, p.max_pct, p.avg_pct) == ("NO_DATA", 0, 0.0, 0.0, 0.0)
    assert parse_power_line("VALID,60,1,2,3").avg_pct == 3.0
    for bad in ("", "POWER_STATUS_VALID,1,2,3", "POWER_STATUS_VALID,x,1,2,3", "POWER_STATUS_VALID,1,1,200,3"):
        with pytest.raises(ValueError):
            parse_power_line(bad)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("trainium2", "trainium2"),
        ("Trainium1", "trainium"),
        ("inferentia", "inferentia"),
        ("Inferentia2", "inferentia2"),
        ("trn1.2xlarge", "trainium"),
        ("trn1n.32xlarge", "trainium"),
        ("trn2u.48xlarge", "trainium2"),
        ("trn3.48xlarge", "trainium3"),
        ("inf1.6xlarge", "inferentia"),
        ("inf2.xlarge", "inferentia2"),
        ("m5.large", None),
        ("Standard PC (Q35 + ICH9, 2009)", None),
    ],
)
def test_normalize_device_type(name: str, expected: str | None) -> None:
    assert normalize_device_type(name) == expected


def test_power_table_is_complete() -> None:
    assert set(DEVICE_MAX_POWER_W) == set(DEVICE_IDLE_POWER_W)
    assert {"inferentia", "inferentia2", "trainium", "trainium2"} <= set(DEVICE_MAX_POWER_W)
    assert all(0 < DEVICE_IDLE_POWER_W[k] < DEVICE_MAX_POWER_W[k] for k in DEVICE_MAX_POWER_W)


# -- the source on a sysfs tree (no neuron-monitor) --------------------------------------


def neuron_tree(
    root: Path, devices: int = 1, power: str | None = "POWER_STATUS_VALID,1700000040,10.00,30.00,20.00"
) -> Path:
    for n in range(devices):
        dev = root / "sys/devices/virtual/neuron_device" / f"neuron{n}"
        (dev / "info/architecture").mkdir(parents=True)
        if power is not None:
            set_power(root, n, power)
    return root


def set_power(root: Path, dev: int, line: str, rel: str = "stats/power/utilization") -> None:
    path = root / "sys/devices/virtual/neuron_device" / f"neuron{dev}" / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(line + "\n")


def sysfs_source(root: Path, clock: list[float] | None = None, **opts: Any) -> tuple[NeuronSource, list[Channel]]:
    now = clock if clock is not None else [NOW]
    options = NeuronOptions(**{"monitor_path": None, "device_type": "trn1", **opts})
    src = NeuronSource(root, options, clock=lambda: now[0])
    return src, src.discover()


def test_unavailable_without_devices_or_monitor(tmp_path: Path) -> None:
    src = NeuronSource(tmp_path, NeuronOptions(monitor_path="no-such-neuron-monitor"))
    with pytest.raises(SourceUnavailable, match=r"^no Neuron devices \(no /sys/devices/virtual/neuron_device\) and"):
        src.discover()


def test_channels_one_per_device(tmp_path: Path) -> None:
    src, channels = sysfs_source(neuron_tree(tmp_path, devices=3))
    assert [c.device for c in channels] == ["neuron0", "neuron1", "neuron2"]
    ch = channels[0]
    assert (ch.source, ch.component, ch.quality) == ("neuron", "accelerator", Quality.MODEL)
    assert ch.max_power_w == pytest.approx(300.0 * 1.2)
    assert dict(ch.info) == {
        "device_type": "trainium",
        "power_source": "sysfs stats/power/utilization",
        "power_scope": "total (idle assumed)",
    }
    assert any("neuron power: sysfs stats/power/utilization" in n.text for n in src.notes)


def test_valid_power_and_bounds(tmp_path: Path) -> None:
    src, _ = sysfs_source(neuron_tree(tmp_path))
    (r,) = src.read()
    assert r.error is None
    # idle 60 W + 20 % of 300 W; bounds idle + (10 %, 30 %) of 300 W
    assert r.power_w == pytest.approx(120.0)
    assert r.power_bounds_w == pytest.approx((90.0, 150.0))
    assert r.gauges["power_avg_percent"] == 20.0 and r.gauges["power_age_s"] == 60.0
    assert r.utilization is None  # no neuron-monitor


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ("POWER_STATUS_NO_DATA,1700000040,0.00,0.00,0.00", "neuron0 power: NO_DATA"),
        ("POWER_STATUS_INVALID,1700000040,0.00,0.00,0.00", "neuron0 power: INVALID"),
        ("POWER_STATUS_MAX,1700000040,0.00,0.00,0.00", "neuron0 power: MAX"),
        ("POWER_STATUS_VALID,1699999900,10.00,30.00,20.00", "neuron0 power: stale (200 s old)"),
        ("POWER_STATUS_VALID,1700000400,10.00,30.00,20.00", "neuron0 power: stale (-300 s old)"),
        ("POWER_STATUS_VALID,17000", "neuron0 power: unreadable (expected 5 fields"),
    ],
)
def test_power_status_errors_never_zero_watts(tmp_path: Path, line: str, error: str) -> None:
    src, _ = sysfs_source(neuron_tree(tmp_path, power=line))
    (r,) = src.read()
    assert r.error is not None and r.error.startswith(error)
    assert r.power_w is None and r.power_bounds_w is None
    assert "power_avg_percent" not in r.gauges  # no 0 % figure for a failed minute


def test_valid_zero_is_idle_not_error(tmp_path: Path) -> None:
    src, _ = sysfs_source(neuron_tree(tmp_path, power="POWER_STATUS_VALID,1700000040,0.00,0.00,0.00"))
    (r,) = src.read()
    assert r.error is None and r.power_w == pytest.approx(60.0) and r.power_bounds_w == pytest.approx((60.0, 60.0))


def test_energy_through_counter_within_bounds(tmp_path: Path) -> None:
    clock = [NOW]
    src, (ch,) = sysfs_source(neuron_tree(tmp_path), clock)
    counter = EnergyCounter(ch)
    assert counter.update(src.read()[0], 0.0) is None
    clock[0] += 10
    d = counter.update(src.read()[0], 10.0)
    assert d is not None and d.healthy
    assert d.energy_j == pytest.approx(1200.0)  # 120 W x 10 s
    err = d.energy_error_j
    assert err == pytest.approx(300.0)  # max(150 - 120, 120 - 90) W x 10 s
    assert err is not None and d.energy_j - err >= 90.0 * 10 and d.energy_j + err <= 150.0 * 10
    # Next minute: power rose; bounds cover both minutes while the interval straddles them.
    set_power(tmp_path, 0, "POWER_STATUS_VALID,1700000100,40.00,60.00,50.00")
    clock[0] += 10
    r = src.read()[0]
    assert r.power_w == pytest.approx(210.0) and r.power_bounds_w == pytest.approx((90.0, 240.0))
    d = counter.update(r, 20.0)
    assert d is not None and d.energy_j == pytest.approx((120.0 + 210.0) / 2 * 10)
    assert d.energy_error_j == pytest.approx(max(240.0 - 165.0, 165.0 - 90.0) * 10)
    # NO_DATA: unhealthy interval, no energy counted, baseline dropped.
    set_power(tmp_path, 0, "POWER_STATUS_NO_DATA,1700000160,0.00,0.00,0.00")
    clock[0] += 60
    d = counter.update(src.read()[0], 80.0)
    assert d is not None and not d.healthy and d.energy_j == 0.0 and d.status == "neuron0 power: NO_DATA"
    assert counter.cumulative_j == pytest.approx(1200.0 + 1650.0)


def test_dynamic_only_and_overrides(tmp_path: Path) -> None:
    src, (ch,) = sysfs_source(neuron_tree(tmp_path), add_background_power=False)
    (r,) = src.read()
    assert r.power_w == pytest.approx(60.0) and r.power_bounds_w == pytest.approx((30.0, 90.0))
    assert ("power_scope", "dynamic only") in ch.info
    src, (ch,) = sysfs_source(
        neuron_tree(tmp_path / "b"), device_max_power_w={"trn1": 400.0}, device_idle_power_w={"trainium": 0.0}
    )
    (r,) = src.read()
    assert r.power_w == pytest.approx(80.0) and ch.max_power_w == pytest.approx(480.0)


def test_moved_power_layout_is_found(tmp_path: Path) -> None:
    root = neuron_tree(tmp_path, power=None)
    set_power(root, 0, "POWER_STATUS_VALID,1700000040,10.00,30.00,20.00", rel="stats/hardware/power/utilization")
    src, (ch,) = sysfs_source(root)
    assert dict(ch.info)["power_source"] == "sysfs stats/hardware/power/utilization (moved layout)"
    assert src.read()[0].power_w == pytest.approx(120.0)


def test_device_type_from_sysfs_or_dmi(tmp_path: Path) -> None:
    root = neuron_tree(tmp_path)
    (root / "sys/devices/virtual/neuron_device/neuron0/info/architecture/device_name").write_text("Inferentia2\n")
    src, (ch,) = sysfs_source(root, device_type=None)
    assert dict(ch.info)["device_type"] == "inferentia2"
    assert src.read()[0].power_w == pytest.approx(40.0 + 0.2 * 200.0)
    root = neuron_tree(tmp_path / "dmi")
    (root / "sys/devices/virtual/dmi/id").mkdir(parents=True)
    (root / "sys/devices/virtual/dmi/id/product_name").write_text("trn2.48xlarge\n")
    src, (ch,) = sysfs_source(root, device_type=None)
    assert dict(ch.info)["device_type"] == "trainium2"
    assert src.host_labels() == {"instance_type": "trn2.48xlarge", "neuron_device_type": "trainium2"}


def test_unknown_device_type_is_an_error(tmp_path: Path) -> None:
    src, (ch,) = sysfs_source(neuron_tree(tmp_path), device_type=None)
    assert ch.max_power_w == pytest.approx(max(DEVICE_MAX_POWER_W.values()) * 1.2)
    (r,) = src.read()
    assert r.error == "neuron0 power: device type unknown (set NeuronOptions.device_type)"


def test_no_power_file_and_no_monitor(tmp_path: Path) -> None:
    src, (ch,) = sysfs_source(neuron_tree(tmp_path, power=None), monitor_path="no-such-neuron-monitor")
    assert dict(ch.info)["power_source"] == "utilization model (no stats/power/utilization)"
    assert any(n.level == "warning" and "no-such-neuron-monitor not found" in n.text for n in src.notes)
    (r,) = src.read()
    assert r.error == "neuron0 power: no NeuronCore utilization (neuron-monitor not running)"


# -- the source with a replayed neuron-monitor child --------------------------------------


@pytest.fixture
def sources() -> Iterator[list[NeuronSource]]:
    made: list[NeuronSource] = []
    yield made
    for src in made:
        src.close()


def replay_source(
    made: list[NeuronSource], tmp_path: Path, *args: str, root: Path | None = None, **opts: Any
) -> NeuronSource:
    options: dict[str, Any] = {
        "monitor_path": str(REPLAY),
        "monitor_args": args,
        # The replay's "#!/usr/bin/env python3" finds this interpreter first (fast start).
        "monitor_env": {"PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])},
        "config_path": tmp_path / "state" / "monitor.conf.json",
        "period_s": 0.05,
        "startup_timeout_s": 5.0,
        "backoff_initial_s": 0.05,
        "backoff_max_s": 0.2,
        **opts,
    }
    src = NeuronSource(root or tmp_path / "empty-root", NeuronOptions(**options))
    made.append(src)
    return src


def test_replayed_stream(tmp_path: Path, sources: list[NeuronSource]) -> None:
    src = replay_source(sources, tmp_path)
    (ch,) = src.discover()  # device count from the first report: no sysfs tree here
    assert (ch.device, ch.quality, dict(ch.info)["device_type"]) == ("neuron0", Quality.MODEL, "trainium")
    config = json.loads((tmp_path / "state/monitor.conf.json").read_text())
    assert config == monitor_config(src.options)
    documented = json.loads((FIX / "docs_monitor.conf.json").read_text())
    assert config["period"] == "50ms" and set(config) == set(documented)
    assert [m["type"] for m in config["neuron_runtimes"][0]["metrics"]] == [
        m["type"] for m in documented["neuron_runtimes"][0]["metrics"]
    ]
    assert sorted(m["type"] for m in config["system_metrics"]) == sorted(
        m["type"] for m in documented["system_metrics"]
    )
    wait_until(lambda: src.monitor_status().reports >= 4, "monitor reports >= 4")
    with monitor_stopped(src):  # a read that waited for the child's next report would hang here
        t0 = time.monotonic()
        (r,) = src.read()
        assert time.monotonic() - t0 < 1.0  # latest state only, never waits for the child
    assert r.error is None
    assert r.utilization is not None and 0.0065 < r.utilization < 0.0069  # cores 0 + 1 of trn1 / 2
    assert r.gauges["memory_used_bytes"] in (101876188, 102298328)
    assert r.gauges["execution_errors"] >= 23654
    assert r.gauges["ecc_mem_uncorrected_count"] == 0.0
    assert r.gauges["neuroncores_per_device"] == 2.0  # the report's count, stored for reports' core claims
    # No power file: utilization model, idle 60 W + u x (300 - 60) W.
    assert r.power_w == pytest.approx(60.0 + r.utilization * 240.0)
    assert r.power_bounds_w is None
    assert src.host_labels() == {
        "instance_type": "trn1.2xlarge",
        "availability_zone": "us-west-2d",
        "region": "us-west-2",
        "neuron_device_type": "trainium",
    }
    status = src.monitor_status()
    assert status.running and status.restarts == 0 and status.bad_lines == 0
    monitor = src.details()["monitor"]  # what `wattline sources --json` shows: JSON-ready
    assert json.loads(json.dumps(monitor)) == monitor and (monitor["running"], monitor["pid"]) == (True, status.pid)
    pid = status.pid
    assert pid is not None
    src.close()
    assert gone(pid) and not src.monitor_status().running


def test_sysfs_power_with_monitor(tmp_path: Path, sources: list[NeuronSource]) -> None:
    root = neuron_tree(tmp_path / "root", power=f"POWER_STATUS_VALID,{int(time.time()) // 60 * 60},10.00,30.00,20.00")
    src = replay_source(sources, tmp_path, root=root)
    assert len(src.discover()) == 1
    wait_until(lambda: src.monitor_status().reports >= 1, "monitor reports >= 1")
    (r,) = src.read()
    assert r.error is None and r.power_w == pytest.approx(120.0)
    assert r.utilization is not None and r.gauges["memory_used_bytes"] > 0


def test_the_configured_cores_per_device_is_the_count_samples_carry(
    tmp_path: Path, sources: list[NeuronSource]
) -> None:
    src = replay_source(sources, tmp_path, cores_per_device=4)
    src.discover()
    wait_until(lambda: src.monitor_status().reports >= 1, "monitor reports >= 1")
    (r,) = src.read()
    assert r.gauges["neuroncores_per_device"] == 4.0  # the override wins over the report's 2


def test_rediscovery_keeps_the_monitor_and_finds_a_new_device(tmp_path: Path, sources: list[NeuronSource]) -> None:
    line = f"POWER_STATUS_VALID,{int(time.time()) // 60 * 60},10.00,30.00,20.00"
    root = neuron_tree(tmp_path / "root", power=line)
    src = replay_source(sources, tmp_path, root=root)
    assert [c.device for c in src.discover()] == ["neuron0"]
    wait_until(lambda: src.monitor_status().reports >= 1, "monitor reports >= 1")
    pid = src.monitor_status().pid
    (root / "sys/devices/virtual/neuron_device/neuron1/info/architecture").mkdir(parents=True)
    set_power(root, 1, line)
    with monitor_stopped(src):  # a rediscovery that waited for a report would hang here
        t0 = time.monotonic()
        assert [c.device for c in src.discover()] == ["neuron0", "neuron1"]
        assert time.monotonic() - t0 < 1.0  # no wait for a first report: the monitor kept running
    status = src.monitor_status()
    assert status.running and status.pid == pid and status.restarts == 0
    assert [r.error for r in src.read()] == [None, None]


def test_malformed_and_truncated_lines_are_skipped(
    tmp_path: Path, sources: list[NeuronSource], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="wattline.agent.sources.neuron")
    src = replay_source(sources, tmp_path, "--inject", "malformed", "--inject", "truncated")
    src.discover()
    wait_until(lambda: src.monitor_status().bad_lines >= 6, "monitor bad_lines >= 6")  # three passes of the stream
    wait_until(lambda: src.monitor_status().last_report_age_s is not None, "a report's age")
    (r,) = src.read()
    assert r.error is None and r.utilization is not None
    skipped = [rec for rec in caplog.records if "skipped a bad line" in rec.getMessage()]
    assert len(skipped) == 1  # rate-limited: one message a minute
    assert src.monitor_status().restarts == 0


def test_error_field_is_noted_not_fatal(tmp_path: Path, sources: list[NeuronSource]) -> None:
    src = replay_source(sources, tmp_path, "--inject", "error")
    src.discover()
    wait_until(lambda: src.monitor_status().report_errors >= 2, "monitor report_errors >= 2")
    (r,) = src.read()
    src.read()
    assert r.error is None
    texts = [n.text for n in src.notes if n.level == "warning"]
    assert texts.count("neuron-monitor report error: neuron-monitor: injected top-level error") == 1
    assert "neuron-monitor report error: runtime 16851: injected runtime error" in texts


def test_exit_mid_stream_restarts_with_backoff(
    tmp_path: Path, sources: list[NeuronSource], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="wattline.agent.sources.neuron")
    log = tmp_path / "starts.log"
    src = replay_source(
        sources, tmp_path, "--inject", "exit-after=1", "--log", str(log), backoff_reset_s=30.0, backoff_max_s=0.4
    )
    src.discover()
    wait_until(
        lambda: src.monitor_status().starts >= 6 and len(log.read_text().splitlines()) >= 6, "six starts, logged"
    )
    status = src.monitor_status()
    assert status.restarts == status.starts - 1 >= 5
    assert status.last_exit == "exited with status 3: neuron-monitor: simulated failure after 1 reports"
    delays = [
        float(m.group(1)) for rec in caplog.records if (m := re.search(r"restarting in ([\d.]+) s", rec.getMessage()))
    ]
    assert delays[:5] == [0.05, 0.1, 0.2, 0.4, 0.4]  # doubling, capped at backoff_max_s
    starts = [float(line.split()[2]) for line in log.read_text().splitlines()]
    # each restart waited at least its delay (a loaded machine only adds to the gaps)
    assert len(starts) >= 6 and all(b - a >= d - 0.01 for a, b, d in zip(starts, starts[1:], delays, strict=False))
    assert src.read()[0].utilization is not None  # the last report still serves
    src.close()
    n = len(log.read_text().splitlines())
    time.sleep(0.3)  # time, not a state: a window in which no restart may come
    assert len(log.read_text().splitlines()) == n  # no restart after close


def test_backoff_resets_after_a_healthy_run(
    tmp_path: Path, sources: list[NeuronSource], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="wattline.agent.sources.neuron")
    src = replay_source(sources, tmp_path, "--inject", "exit-after=2", backoff_reset_s=0.0)
    src.discover()
    wait_until(lambda: src.monitor_status().starts >= 4, "monitor starts >= 4")
    delays = [rec.getMessage() for rec in caplog.records if "restarting in" in rec.getMessage()]
    assert len(delays) >= 3 and all(d.endswith("restarting in 0.05 s") for d in delays)


def test_stderr_is_drained(tmp_path: Path, sources: list[NeuronSource]) -> None:
    # 1 MiB of stderr would block a child whose stderr pipe nobody reads.
    src = replay_source(sources, tmp_path, "--inject", "stderr-flood")
    src.discover()
    wait_until(
        lambda: src.monitor_status().stderr_last_line == "neuron-monitor: flood done", "the flood's last stderr line"
    )
    assert src.read()[0].utilization is not None


def test_close_kills_a_child_that_ignores_sigterm(tmp_path: Path, sources: list[NeuronSource]) -> None:
    src = replay_source(sources, tmp_path, "--ignore-sigterm", terminate_timeout_s=0.2)
    src.discover()
    pid = src.monitor_status().pid
    assert pid is not None
    t0 = time.monotonic()
    src.close()
    assert gone(pid) and time.monotonic() - t0 < 2.0
    src.close()  # idempotent


def test_monitor_without_reports_is_unavailable(tmp_path: Path, sources: list[NeuronSource]) -> None:
    bad = tmp_path / "bad.ndjson"
    bad.write_text("not json\n")
    src = replay_source(sources, tmp_path, "--file", str(bad), startup_timeout_s=0.5)
    with pytest.raises(SourceUnavailable, match=r"neuron-monitor gave no report within 0\.5 s"):
        src.discover()
    assert not src.monitor_status().running
    # A child that dies at once: discovery gives up early and says why.
    src = replay_source(sources, tmp_path, "--file", str(tmp_path / "missing.ndjson"), startup_timeout_s=4.0)
    t0 = time.monotonic()
    with pytest.raises(SourceUnavailable, match=r"exited with status 1: FileNotFoundError"):
        src.discover()
    assert time.monotonic() - t0 < 2.0
    assert not (tmp_path / "missing.ndjson").exists()


def test_private_config_dir_is_removed(tmp_path: Path, sources: list[NeuronSource]) -> None:
    src = replay_source(sources, tmp_path, config_path=None)
    src.discover()
    tmpdir = src._tmpdir
    assert tmpdir is not None and (tmpdir / "monitor.conf.json").is_file()
    src.close()
    assert not tmpdir.exists()


def test_stale_monitor_fails_the_model(tmp_path: Path, sources: list[NeuronSource]) -> None:
    src = replay_source(sources, tmp_path, "--inject", "exit-after=1", backoff_initial_s=30.0, report_stale_s=0.2)
    src.discover()
    wait_until(lambda: src.monitor_status().last_exit, "the monitor's exit")
    time.sleep(0.3)  # time, not a state: the last report ages past report_stale_s
    (r,) = src.read()
    assert r.utilization is None and r.power_w is None
    assert r.error is not None and re.fullmatch(
        r"neuron0 power: no NeuronCore utilization \(last report \d+\.\d s old; exited with status 3: .*\)", r.error
    )
