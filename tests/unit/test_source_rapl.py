"""RAPL source on recorded and kernel-layout powercap trees."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from sysfs_trees import AMD_RANGE_UJ, INTEL_RANGE_UJ, Constraint, Zone, copy_fixture, powercap_tree, set_energy

from wattline.agent.counter import EnergyCounter
from wattline.agent.sources import sysfs
from wattline.agent.sources.base import Channel, SourceUnavailable
from wattline.agent.sources.rapl import Options, RaplSource
from wattline.quality import Quality

PKG_CONSTRAINTS = [Constraint("long_term", 4090000000, 999424, 95000000), Constraint("short_term", 4090000000, 2440, 0)]


def devices(channels: list[Channel]) -> list[tuple[str, str]]:
    return [(c.device, c.component) for c in channels]


def discovered(root: Path, options: Options | None = None) -> tuple[RaplSource, list[Channel]]:
    src = RaplSource(root, options)
    return src, src.discover()


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def xps7390(tmp_path: Path) -> Path:
    """The zone listing of fixtures/rapl/observed/lkml-2020-03-26-xps7390-zone-names.txt."""
    return powercap_tree(
        tmp_path,
        [
            Zone("intel-rapl:0", "package-0", 1_000_000, constraints=PKG_CONSTRAINTS),
            Zone("intel-rapl:0:0", "core", 2_000_000, constraints=[Constraint(max_power_uw=None)]),
            Zone("intel-rapl:0:1", "uncore", 3_000_000, constraints=[Constraint(max_power_uw=None)]),
            Zone("intel-rapl:1", "psys", 4_000_000, constraints=PKG_CONSTRAINTS),
            Zone("intel-rapl-mmio:0", "package-0", 1_000_007, constraints=PKG_CONSTRAINTS),
        ],
    )


# -- the recorded fixture tree ---------------------------------------------------------


def test_recorded_fixture_tree(tmp_path: Path) -> None:
    src, channels = discovered(copy_fixture("rapl/sysfs_tree", tmp_path))
    assert devices(channels) == [
        ("package-0", "cpu_package"),
        ("package-0/core", "cpu_core"),
        ("package-10", "cpu_package"),
    ]
    pkg, core, pkg10 = channels
    assert pkg.source == "rapl" and pkg.quality is Quality.COUNTER
    assert (pkg.counter_scale_j, pkg.counter_max) == (1e-6, INTEL_RANGE_UJ)
    assert pkg.max_power_w == pytest.approx(95.0 * 4.0)  # TDP x max_power_factor
    assert core.max_power_w == 1000.0  # empty constraint_0_max_power_uw: the default
    assert pkg.info == (("zone", "intel-rapl:0"), ("name", "package-0"))
    assert core.info == (("zone", "intel-rapl:0:0"), ("name", "core"))
    assert pkg10.info == (("zone", "intel-rapl:a"), ("name", "package-10"))
    assert [r.energy_raw for r in src.read()] == [240422366267, 118821284256, 240422366267]
    assert any("intel-rapl:0:0" in n.text and "enabled=0" in n.text for n in src.notes)
    src.close()


def test_max_power_options(tmp_path: Path) -> None:
    opts = Options(default_max_power_w=300.0, max_power_factor=2.0)
    _, channels = discovered(copy_fixture("rapl/sysfs_tree", tmp_path), opts)
    assert [c.max_power_w for c in channels] == [pytest.approx(190.0), 300.0, pytest.approx(190.0)]


# -- layouts ---------------------------------------------------------------------------


def test_kernel_symlink_layout_subzones_psys_and_mmio_mirror(xps7390: Path) -> None:
    klass = xps7390 / "sys/class/powercap"
    assert (klass / "intel-rapl:0:1").is_symlink()
    assert (klass / "intel-rapl:0:1").resolve() == (
        xps7390 / "sys/devices/virtual/powercap/intel-rapl/intel-rapl:0/intel-rapl:0:1"
    )
    src, channels = discovered(xps7390)
    assert devices(channels) == [
        ("package-0", "cpu_package"),
        ("package-0/core", "cpu_core"),
        ("package-0/uncore", "cpu_uncore"),
        ("psys", "psys"),
    ]
    assert [r.energy_raw for r in src.read()] == [1_000_000, 2_000_000, 3_000_000, 4_000_000]
    mirror = [n for n in src.notes if "intel-rapl-mmio:0" in n.text]
    assert len(mirror) == 1 and "not counted twice" in mirror[0].text
    src.close()


def test_mmio_zone_is_used_when_no_msr_zone_exists(tmp_path: Path) -> None:
    powercap_tree(tmp_path, [Zone("intel-rapl-mmio:0", "package-0", 42, constraints=PKG_CONSTRAINTS)])
    src, channels = discovered(tmp_path)
    assert devices(channels) == [("package-0", "cpu_package")]
    assert channels[0].info[0] == ("zone", "intel-rapl-mmio:0")
    assert src.read()[0].energy_raw == 42
    src.close()


def test_hex_zone_ids_sort_numerically_and_names_come_from_sysfs(tmp_path: Path) -> None:
    powercap_tree(
        tmp_path,
        [
            Zone("intel-rapl:10", "package-16", 16),
            Zone("intel-rapl:2", "package-2", 2),
            Zone("intel-rapl:a", "package-10", 10),
        ],
    )
    src, channels = discovered(tmp_path)
    assert [c.device for c in channels] == ["package-2", "package-10", "package-16"]
    assert [c.info[0][1] for c in channels] == ["intel-rapl:2", "intel-rapl:a", "intel-rapl:10"]
    assert [r.energy_raw for r in src.read()] == [2, 10, 16]
    src.close()


def test_server_dies_and_dram(tmp_path: Path) -> None:
    powercap_tree(
        tmp_path,
        [
            Zone("intel-rapl:0", "package-0-die-0", 1, constraints=PKG_CONSTRAINTS),
            Zone("intel-rapl:0:0", "dram", 2),
            Zone("intel-rapl:1", "package-0-die-1", 3, constraints=PKG_CONSTRAINTS),
            Zone("intel-rapl:1:0", "dram", 4),
        ],
    )
    _, channels = discovered(tmp_path)
    assert devices(channels) == [
        ("package-0-die-0", "cpu_package"),
        ("package-0-die-0/dram", "dram"),
        ("package-0-die-1", "cpu_package"),
        ("package-0-die-1/dram", "dram"),
    ]


def test_amd_zen_package_and_core(tmp_path: Path) -> None:
    powercap_tree(
        tmp_path,
        [
            Zone("intel-rapl:0", "package-0", 11, AMD_RANGE_UJ),
            Zone("intel-rapl:0:0", "core", 12, AMD_RANGE_UJ),
            Zone("intel-rapl:1", "package-1", 13, AMD_RANGE_UJ),
            Zone("intel-rapl:1:0", "core", 14, AMD_RANGE_UJ),
        ],
    )
    src, channels = discovered(tmp_path)
    assert devices(channels) == [
        ("package-0", "cpu_package"),
        ("package-0/core", "cpu_core"),
        ("package-1", "cpu_package"),
        ("package-1/core", "cpu_core"),
    ]
    assert {c.counter_max for c in channels} == {AMD_RANGE_UJ}
    assert {c.max_power_w for c in channels} == {1000.0}  # AMD has no power-limit constraints
    assert [r.energy_raw for r in src.read()] == [11, 12, 13, 14]
    src.close()


def test_disabled_zones_are_still_read_i9_13900hx(tmp_path: Path) -> None:
    """Layout of fixtures/rapl/observed/raplcap-issue14-rapl-info.txt."""
    constraints = [
        Constraint("long_term", 135000000, 95944704, 55000000),
        Constraint("short_term", 162000000, 2440, 0),
        Constraint("peak_power", 315000000, 0, 0),
    ]
    powercap_tree(
        tmp_path,
        [
            Zone("intel-rapl:0", "package-0", 100, constraints=constraints),
            Zone("intel-rapl:0:0", "core", 200, enabled=0, constraints=[Constraint(max_power_uw=None)]),
            Zone("intel-rapl:0:1", "uncore", 300, enabled=0, constraints=[Constraint(max_power_uw=None)]),
        ],
    )
    src, channels = discovered(tmp_path)
    assert channels[0].max_power_w == pytest.approx(55.0 * 4.0)
    assert [r.energy_raw for r in src.read()] == [100, 200, 300]
    disabled = [n.text for n in src.notes if "enabled=0" in n.text]
    assert disabled == [
        "intel-rapl:0:0 (package-0/core): enabled=0 (no power limiting); its counter is still read",
        "intel-rapl:0:1 (package-0/uncore): enabled=0 (no power limiting); its counter is still read",
    ]
    src.close()


def test_unknown_domain_is_skipped_with_a_note(tmp_path: Path) -> None:
    powercap_tree(tmp_path, [Zone("intel-rapl:0", "package-0", 1), Zone("intel-rapl:0:0", "gpu-tile", 2)])
    src, channels = discovered(tmp_path)
    assert devices(channels) == [("package-0", "cpu_package")]
    assert any("unknown RAPL domain 'gpu-tile'" in n.text for n in src.notes)


# -- unavailable -----------------------------------------------------------------------


def test_no_zones(tmp_path: Path) -> None:
    with pytest.raises(SourceUnavailable) as exc:
        RaplSource(tmp_path).discover()
    assert str(exc.value) == (
        "no RAPL zones under /sys/class/powercap (virtual machine, container, or CPU without RAPL)"
    )


def test_control_type_directories_alone_are_no_zones(tmp_path: Path) -> None:
    powercap_tree(tmp_path, [Zone("intel-rapl:0", "package-0", 1), Zone("intel-rapl-mmio:0", "package-0", 1)])
    for zone in ("intel-rapl:0", "intel-rapl-mmio:0"):
        (tmp_path / "sys/class/powercap" / zone).unlink()
    with pytest.raises(SourceUnavailable, match=r"^no RAPL zones under"):
        RaplSource(tmp_path).discover()


def test_permission_denied_says_how_to_grant_access(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    powercap_tree(tmp_path, [Zone("intel-rapl:0", "package-0", 1), Zone("intel-rapl:0:0", "core", 2)])
    real_open = sysfs.open_ro

    def root_only(path: str) -> int:
        if path.endswith("intel-rapl:0:0/energy_uj"):
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return real_open(path)

    monkeypatch.setattr(sysfs, "open_ro", root_only)
    before = open_fds()
    with pytest.raises(SourceUnavailable) as exc:
        RaplSource(tmp_path).discover()
    message = str(exc.value)
    path = tmp_path / "sys/class/powercap/intel-rapl:0:0/energy_uj"
    assert message.startswith(f"cannot read {path} (permission denied: root-only since Linux 5.10); grant read access:")
    assert "chgrp powercap /sys/class/powercap/intel-rapl:*/energy_uj" in message
    assert "add the agent's user to group powercap" in message and "\n" not in message
    assert open_fds() == before  # package-0's descriptor was closed again


# -- bad values and vanishing files ----------------------------------------------------


@pytest.mark.parametrize(("content", "shown"), [("abc", "'abc'"), ("", "''"), ("-5", "'-5'"), ("12 34", "'12 34'")])
def test_bad_value_is_an_error_reading_not_an_exception(tmp_path: Path, content: str, shown: str) -> None:
    powercap_tree(tmp_path, [Zone("intel-rapl:0", "package-0", 1), Zone("intel-rapl:1", "package-1", 2)])
    src, _ = discovered(tmp_path)
    set_energy(tmp_path, "intel-rapl:0", content)
    first, second = src.read()
    assert first.energy_raw is None
    assert first.error == f"bad value in {tmp_path}/sys/class/powercap/intel-rapl:0/energy_uj: {shown}"
    assert second.error is None and second.energy_raw == 2
    set_energy(tmp_path, "intel-rapl:0", 7)
    assert src.read()[0].energy_raw == 7
    src.close()


def test_truncated_file_without_digits(tmp_path: Path) -> None:
    powercap_tree(tmp_path, [Zone("intel-rapl:0", "package-0", 1)])
    src, _ = discovered(tmp_path)
    energy = tmp_path / "sys/class/powercap/intel-rapl:0/energy_uj"
    energy.write_bytes(b"\n")
    assert src.read()[0].error == f"bad value in {energy}: ''"
    energy.write_bytes(b"2404\xff")
    assert src.read()[0].error == f"bad value in {energy}: '2404\ufffd'"
    src.close()


def test_vanished_zone_gives_error_then_recovers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    powercap_tree(tmp_path, [Zone("intel-rapl:0", "package-0", 5), Zone("intel-rapl:1", "package-1", 6)])
    src, _ = discovered(tmp_path)
    energy = tmp_path / "sys/class/powercap/intel-rapl:0/energy_uj"
    gone = {energy.stat().st_ino}
    real_pread = os.pread

    def unplugged(fd: int, n: int, offset: int) -> bytes:
        inode = os.fstat(fd).st_ino
        if inode in gone:  # the kernel answers ENODEV on a removed attribute (once here)
            gone.discard(inode)
            raise OSError(errno.ENODEV, "No such device")
        return real_pread(fd, n, offset)

    monkeypatch.setattr(os, "pread", unplugged)
    energy.unlink()
    first, second = src.read()
    assert first.error == f"cannot read {energy}: No such device"
    assert second.energy_raw == 6
    assert src.read()[0].error == f"cannot read {energy}: No such file or directory"
    set_energy(tmp_path, "intel-rapl:0", 9)  # the zone re-registered: a new file
    assert src.read()[0].energy_raw == 9
    src.close()


# -- the read path ---------------------------------------------------------------------


def test_read_is_one_pread_per_zone_on_kept_descriptors(xps7390: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src, channels = discovered(xps7390)
    calls: list[tuple[int, int, int]] = []
    real_pread = os.pread

    def counting(fd: int, n: int, offset: int) -> bytes:
        calls.append((fd, n, offset))
        return real_pread(fd, n, offset)

    def no_open(path: str) -> int:
        raise AssertionError(f"read() opened {path}")

    monkeypatch.setattr(os, "pread", counting)
    monkeypatch.setattr(sysfs, "open_ro", no_open)
    src.read()
    src.read()
    assert len(calls) == 2 * len(channels)
    assert len({fd for fd, _, _ in calls}) == len(channels)
    assert {(n, offset) for _, n, offset in calls} == {(32, 0)}
    src.close()


def test_close_releases_every_descriptor(xps7390: Path) -> None:
    before = open_fds()
    src, channels = discovered(xps7390)
    assert open_fds() == before + len(channels)
    src.discover()  # rediscovery does not leak the first set
    assert open_fds() == before + len(channels)
    src.close()
    assert open_fds() == before
    assert src.read() == []


# -- end to end with the counter -------------------------------------------------------


def test_counter_end_to_end_across_wrap_and_reset(tmp_path: Path) -> None:
    powercap_tree(
        tmp_path, [Zone("intel-rapl:0", "package-0", INTEL_RANGE_UJ - 2_000_000, constraints=PKG_CONSTRAINTS)]
    )
    src, (channel,) = discovered(tmp_path)
    counter = EnergyCounter(channel)
    steps = [
        (0.0, INTEL_RANGE_UJ - 2_000_000, None),  # baseline
        (1.0, INTEL_RANGE_UJ - 1_000_000, 1.0),
        (2.0, 30_000_000, 31.0),  # wrapped past max_energy_range_uj: 1 J to the top, 30 J after
        (3.0, 5_000, 0.0),  # reset (a wrap would mean 262 kJ in 1 s): nothing counted
        (4.0, 45_005_000, 45.0),
    ]
    statuses = []
    for t, raw, expected in steps:
        set_energy(tmp_path, "intel-rapl:0", raw)
        (reading,) = src.read()
        assert reading.energy_raw == raw
        delta = counter.update(reading, t)
        assert (None if delta is None else delta.energy_j) == (None if expected is None else pytest.approx(expected))
        statuses.append(None if delta is None else delta.status)
    assert statuses == [None, "", "", "counter reset", ""]
    assert counter.cumulative_j == pytest.approx(77.0, abs=1e-9)
    src.close()


def test_counter_end_to_end_failed_read_loses_no_joule(tmp_path: Path) -> None:
    powercap_tree(tmp_path, [Zone("intel-rapl:0", "package-0", 1_000_000, constraints=PKG_CONSTRAINTS)])
    src, (channel,) = discovered(tmp_path)
    counter = EnergyCounter(channel)
    energies = []
    steps: list[tuple[float, int | str]] = [(0.0, 1_000_000), (1.0, 11_000_000), (2.0, "garbage"), (3.0, 31_000_000)]
    for t, raw in [*steps, (4.0, 41_000_000)]:
        set_energy(tmp_path, "intel-rapl:0", raw)
        delta = counter.update(src.read()[0], t)
        energies.append(None if delta is None else delta.energy_j)
    assert energies == [None, pytest.approx(10.0), None, pytest.approx(20.0), pytest.approx(10.0)]
    assert counter.cumulative_j == pytest.approx(40.0)  # the counter kept counting through the bad read
    src.close()
