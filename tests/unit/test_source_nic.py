"""NIC model source on kernel-layout /sys/class/net trees and the recorded EFA counters."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from sysfs_trees import Iface, copy_fixture, efa_tree, net_tree, set_stat

from wattline.agent.counter import EnergyCounter, counter_ticks
from wattline.agent.registry import source_class
from wattline.agent.sources.base import SourceUnavailable
from wattline.agent.sources.nic import NicSource, Options
from wattline.config import build
from wattline.quality import Quality

EFA_DEVICE = "efa:rdmap144s27/1"


class FakeClock:
    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def host(tmp_path: Path) -> Path:
    """A host like fixtures/nic/procfs_fixture (eth0, lo, docker0, a veth) plus down/unknown NICs."""
    return net_tree(
        tmp_path,
        [
            Iface("lo", None, "unknown", 772, {"rx_bytes": 1664039048, "tx_bytes": 1664039048}),
            Iface("eth0", "0000:00:05.0", "up", stats={"rx_bytes": 874354587, "tx_bytes": 563352563}),
            Iface("eth1", "0000:00:06.0", "down"),
            Iface("ens7", "0000:00:07.0", "lowerlayerdown"),
            Iface("ens8", "0000:00:08.0", "unknown", stats={"rx_bytes": 5}),
            Iface("docker0", None, "up", stats={"rx_bytes": 2568, "tx_bytes": 438}),
            Iface("vethf345468", None, "up", stats={"rx_bytes": 648, "tx_bytes": 438}),
        ],
    )


def names(src: NicSource) -> list[str]:
    return [c.device for c in src.discover()]


# -- discovery -------------------------------------------------------------------------


def test_skips_loopback_virtual_and_down(host: Path) -> None:
    src = NicSource(host)
    assert names(src) == ["ens8", "eth0"]  # operstate "unknown" carries traffic
    notes = {n.text for n in src.notes}
    assert {
        "lo: loopback; skipped",
        "eth1: operstate down; skipped",
        "ens7: operstate lowerlayerdown; skipped",
    } <= notes
    assert "docker0: virtual (no device link); skipped" in notes
    src.close()


def test_loopback_by_type_772(tmp_path: Path) -> None:
    net_tree(tmp_path, [Iface("lo0", "0000:00:05.0", "up", 772), Iface("eth0")])
    assert names(NicSource(tmp_path)) == ["eth0"]


def test_include_options_and_allow_list(host: Path) -> None:
    everything = Options(include_loopback=True, include_down=True, include_virtual=True)
    assert names(NicSource(host, everything)) == ["docker0", "ens7", "ens8", "eth0", "eth1", "lo", "vethf345468"]
    assert names(NicSource(host, Options(include_loopback=True))) == ["ens8", "eth0", "lo"]
    src = NicSource(host, Options(interfaces=["eth0", "eth1", "wlan0"]))
    assert names(src) == ["eth0"]
    assert any(n.text == "wlan0: listed in interfaces but not in /sys/class/net" for n in src.notes)


def test_channel_is_a_model(host: Path) -> None:
    _, eth0 = NicSource(host, Options(idle_w=2.0, j_per_byte=1e-9, max_link_gbps=100.0)).discover()
    assert (eth0.source, eth0.component, eth0.device, eth0.quality) == ("nic", "nic", "eth0", Quality.MODEL)
    assert eth0.max_power_w == pytest.approx(2.0 + 1e-9 * 25e9)  # idle + J/B x 2 directions x 12.5 GB/s
    assert "model" in dict(eth0.info)["model"]


def test_no_interfaces_is_unavailable(tmp_path: Path) -> None:
    net_tree(tmp_path, [Iface("lo", None, "unknown", 772)])
    with pytest.raises(SourceUnavailable, match="no network interfaces to model"):
        NicSource(tmp_path).discover()
    with pytest.raises(SourceUnavailable):
        NicSource(tmp_path / "empty").discover()


# -- the model -------------------------------------------------------------------------


def test_energy_is_idle_plus_bytes_moved(host: Path) -> None:
    clock = FakeClock(100.0)
    src = NicSource(host, Options(idle_w=2.0, j_per_byte=1e-9, interfaces=["eth0"]), clock=clock)
    src.discover()
    (first,) = src.read()
    assert first.energy_j == 0.0
    assert first.gauges == {"rx_bytes": 874354587.0, "tx_bytes": 563352563.0, "rx_packets": 0.0, "tx_packets": 0.0}
    set_stat(host, "eth0", "rx_bytes", 874354587 + 3_000_000)
    set_stat(host, "eth0", "tx_bytes", 563352563 + 1_000_000)
    set_stat(host, "eth0", "rx_packets", 2500)
    clock.t = 102.5
    (second,) = src.read()
    assert second.energy_j == pytest.approx(2.0 * 2.5 + 1e-9 * 4_000_000, rel=1e-12)  # 5.004 J
    assert second.gauges["rx_packets"] == 2500.0
    clock.t = 103.0
    assert src.read()[0].energy_j == pytest.approx(1.0, rel=1e-12)  # idle only: no bytes moved
    src.close()


def test_rediscovery_keeps_each_interfaces_baseline(host: Path) -> None:
    clock = FakeClock(100.0)
    src = NicSource(host, Options(idle_w=2.0, j_per_byte=1e-9, interfaces=["eth0"]), clock=clock)
    src.discover()
    src.read()
    set_stat(host, "eth0", "rx_bytes", 874354587 + 3_000_000)
    clock.t = 101.0
    assert [c.device for c in src.discover()] == ["eth0"]  # found again between two reads
    (after,) = src.read()
    assert after.energy_j == pytest.approx(2.0 * 1.0 + 1e-9 * 3_000_000, rel=1e-12)  # no interval lost
    src.close()


def test_counter_reset_counts_idle_only_and_says_so(host: Path) -> None:
    """counter.py's reset policy: bytes moved across a reset are unknown, never counted (the
    old NIC policy counted the new value as bytes moved); the model's idle power still is."""
    clock = FakeClock()
    src = NicSource(host, Options(idle_w=2.0, j_per_byte=1e-6, interfaces=["eth0"]), clock=clock)
    counter = EnergyCounter(src.discover()[0])
    counter.update(src.read()[0], clock.t)
    set_stat(host, "eth0", "rx_bytes", 1000)  # driver reload: counters restart from 0
    set_stat(host, "eth0", "tx_bytes", 500)
    clock.t += 1
    delta = counter.update(src.read()[0], clock.t)
    assert delta is not None and delta.energy_j == pytest.approx(2.0) and delta.healthy
    assert delta.status.startswith("counter reset")
    set_stat(host, "eth0", "rx_bytes", 3000)  # counting goes on from the new baseline
    clock.t += 1
    delta = counter.update(src.read()[0], clock.t)
    assert delta is not None and delta.energy_j == pytest.approx(2.0 + 2000 * 1e-6) and delta.status == ""
    src.close()


def test_counter_ticks() -> None:
    assert counter_ticks(10, 25, None) == 15
    assert counter_ticks(10, 10, None) == 0
    assert counter_ticks(2**63, 7, None) is None  # no wrap range: a drop is a reset, never a wrap
    assert counter_ticks(2**64 - 10, 2**64 - 1, None) == 9
    assert counter_ticks(90, 5, 100) == 15  # a wrap at 100
    assert counter_ticks(90, 5, 100, lambda ticks: ticks < 10) is None  # an implausible wrap is a reset


def test_large_counters_stay_exact(tmp_path: Path) -> None:
    big = 2**60
    net_tree(tmp_path, [Iface("eth0", stats={"rx_bytes": big, "tx_bytes": big})])
    clock = FakeClock()
    src = NicSource(tmp_path, Options(idle_w=0.0, j_per_byte=1.0), clock=clock)
    src.discover()
    src.read()
    set_stat(tmp_path, "eth0", "rx_bytes", big + 3)  # big + 3 is not a float
    clock.t += 1
    assert src.read()[0].energy_j == 3.0
    src.close()


def test_vanished_interface_gives_error_and_a_fresh_baseline(host: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    src = NicSource(host, Options(idle_w=1.0, j_per_byte=0.0), clock=clock)
    src.discover()
    src.read()
    stats = host / "sys/class/net/eth0/statistics"
    gone = {(stats / f).stat().st_ino for f in ("rx_bytes", "tx_bytes", "rx_packets", "tx_packets")}
    real_pread = os.pread

    def unplugged(fd: int, n: int, offset: int) -> bytes:
        if os.fstat(fd).st_ino in gone:
            raise OSError(errno.ENODEV, "No such device")
        return real_pread(fd, n, offset)

    monkeypatch.setattr(os, "pread", unplugged)
    clock.t += 1
    ens8, eth0 = src.read()
    assert eth0.error == f"cannot read {stats}/rx_bytes: No such device" and eth0.energy_j is None
    assert ens8.error is None and ens8.energy_j == pytest.approx(1.0)
    monkeypatch.setattr(os, "pread", real_pread)
    clock.t += 1
    assert src.read()[1].energy_j == 0.0  # the interval spanning the failure is unknown
    clock.t += 1
    assert src.read()[1].energy_j == pytest.approx(1.0)
    src.close()


def test_counter_end_to_end(host: Path) -> None:
    clock = FakeClock(0.0)
    src = NicSource(host, Options(idle_w=1.0, j_per_byte=1e-8, interfaces=["eth0"]), clock=clock)
    (channel,) = src.discover()
    counter = EnergyCounter(channel)
    rx = 874354587
    energies = []
    for t in (0.0, 1.0, 2.0):
        clock.t = t
        rx += 100_000_000
        set_stat(host, "eth0", "rx_bytes", rx)
        delta = counter.update(src.read()[0], t)
        energies.append(None if delta is None else delta.energy_j)
    assert energies == [None, pytest.approx(2.0), pytest.approx(2.0)]  # 1 W x 1 s + 1e-8 J/B x 1e8 B
    assert counter.cumulative_j == pytest.approx(4.0)
    src.close()


# -- EFA -------------------------------------------------------------------------------


def test_efa_recorded_counters(tmp_path: Path) -> None:
    copy_fixture("nic/efa_observed", tmp_path)
    net_tree(tmp_path, [Iface("ens32")])
    clock = FakeClock()
    src = NicSource(tmp_path, Options(idle_w=1.0, j_per_byte=1e-9), clock=clock)
    assert [c.device for c in src.discover()] == ["ens32", EFA_DEVICE]
    efa = src.read()[1]
    assert efa.channel.component == "nic" and efa.channel.quality is Quality.MODEL
    assert efa.gauges == {
        "rx_bytes": 85466418782288.0,
        "tx_bytes": 84417311044934.0,
        "rx_packets": 1776383627.0,
        "tx_packets": 11002381069.0,
    }
    hw = tmp_path / "sys/class/infiniband/rdmap144s27/ports/1/hw_counters"
    (hw / "tx_bytes").write_text("84417321044934\n")  # +10 MB
    clock.t += 2
    assert src.read()[1].energy_j == pytest.approx(2.0 + 1e-9 * 10_000_000)
    src.close()


def test_efa_kernel_layout_without_packet_counters(tmp_path: Path) -> None:
    efa_tree(tmp_path, "rdmap0s6", {"tx_bytes": 10, "rx_bytes": 20, "lifespan": 12})
    efa_tree(tmp_path, "mlx5_0", {"out_of_buffer": 0, "rx_write_requests": 4}, pci="0000:90:1c.0")  # no byte counters
    src = NicSource(tmp_path)
    assert [c.device for c in src.discover()] == ["efa:rdmap0s6/1"]
    assert src.read()[0].gauges == {"rx_bytes": 20.0, "tx_bytes": 10.0}
    src.close()


def test_efa_option_off(tmp_path: Path) -> None:
    copy_fixture("nic/efa_observed", tmp_path)
    with pytest.raises(SourceUnavailable):
        NicSource(tmp_path, Options(efa=False)).discover()


# -- descriptors and configuration -----------------------------------------------------


def test_close_releases_descriptors(host: Path) -> None:
    before = len(os.listdir("/proc/self/fd"))
    src = NicSource(host)
    src.discover()
    assert len(os.listdir("/proc/self/fd")) == before + 2 * 4
    src.close()
    assert len(os.listdir("/proc/self/fd")) == before


def test_options_build_from_config() -> None:
    cls, options_cls = source_class("nic")
    assert cls is NicSource and options_cls is Options
    env = {"WATTLINE_SOURCES_NIC_IDLE_W": "2.5", "WATTLINE_SOURCES_NIC_INTERFACES": "eth0, ens5"}
    opts = build(Options, "sources.nic", {"sources": {"nic": {"efa": False}}}, env)
    assert (opts.idle_w, opts.interfaces, opts.efa, opts.j_per_byte) == (2.5, ["eth0", "ens5"], False, 2e-10)
