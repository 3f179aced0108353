"""The README's layers hold in the source: imports point down only (cli 4 -> workloads 3 ->
agent, collector 2 -> wattline/*.py 1; agent and collector never import each other), no
module takes a private name from another package, and no module outgrows the size rule."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Folder -> its package and floor.
PACKAGES = {
    "wattline/cli": ("wattline.cli", 4),
    "wattline/workloads": ("wattline.workloads", 3),
    "wattline/agent": ("wattline.agent", 2),
    "wattline/collector": ("wattline.collector", 2),
}
#: Most lines a CLI module may hold (#21: the CLI only parses and calls).
CLI_MAX_LINES = 450
#: Most lines any hand-written module may hold (#21: each piece in its one place).
MAX_LINES = 450
#: Folders of hand-written code, and the generated one among them.
SOURCE_FOLDERS = ("wattline", "bench")
GENERATED = "wattline/v1"


def package_of(module: str) -> tuple[str, int] | None:
    """(package, floor) of a ``wattline`` module; None outside wattline."""
    parts = module.split(".")
    if parts[0] != "wattline":
        return None
    for name, floor in PACKAGES.values():
        if module == name or module.startswith(name + "."):
            return name, floor
    return "wattline", 1


def modules(root: Path) -> Iterator[tuple[Path, str]]:
    """Every hand-written module under ``root``: (file, dotted name)."""
    for folder, (package, _floor) in PACKAGES.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = path.relative_to(root / folder).with_suffix("").parts
            yield path, ".".join([package, *parts]).removesuffix(".__init__")
    for path in sorted((root / "wattline").glob("*.py")):
        yield path, f"wattline.{path.stem}".removesuffix(".__init__")


def imports(path: Path, module: str) -> Iterator[tuple[str, list[str], int]]:
    """(imported module, names taken from it, line) for every import in the file, lazy and
    ``TYPE_CHECKING`` ones included."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, [], node.lineno
        elif isinstance(node, ast.ImportFrom):
            target = node.module or ""
            if node.level:
                base = module.split(".")
                keep = len(base) - node.level + (1 if path.name == "__init__.py" else 0)
                target = ".".join([*base[:keep], *([node.module] if node.module else [])])
            yield target, [a.name for a in node.names], node.lineno


def violations(root: Path) -> list[str]:
    """One line per import that points up or across floor 2, or takes another package's
    private name."""
    found: list[str] = []
    for path, module in modules(root):
        own = package_of(module)
        assert own is not None
        for target, names, line in imports(path, module):
            other = package_of(target)
            if other is None:
                continue
            where = f"{path.relative_to(root)}:{line} imports {target}"
            if other[1] > own[1] or (own[1] == other[1] == 2 and own[0] != other[0]):
                found.append(f"{where}: floor {own[1]} imports floor {other[1]}")
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            if private and other[0] != own[0]:
                found.append(f"{where}: private {', '.join(private)}")
    return found


def test_imports_point_down_and_take_no_private_names() -> None:
    assert violations(ROOT) == []


def test_the_check_finds_an_upward_import_and_a_private_name(tmp_path: Path) -> None:
    """The check can fail: a tree with each mistake is caught, naming the file and line."""
    for folder in PACKAGES:
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
    (tmp_path / "wattline/units.py").write_text("from wattline.agent.counter import EnergyCounter\n")
    (tmp_path / "wattline/agent/uplink.py").write_text("import os\n\nfrom wattline.collector import server\n")
    (tmp_path / "wattline/cli/report.py").write_text("def f():\n    from wattline.workloads.render import _iso\n")
    (tmp_path / "wattline/workloads/render.py").write_text("from .report import _window\n")  # same package: allowed
    assert violations(tmp_path) == [
        "wattline/cli/report.py:2 imports wattline.workloads.render: private _iso",
        "wattline/agent/uplink.py:3 imports wattline.collector: floor 2 imports floor 2",
        "wattline/units.py:1 imports wattline.agent.counter: floor 1 imports floor 2",
    ]


def test_cli_modules_stay_small() -> None:
    sizes = {p.name: len(p.read_text(encoding="utf-8").splitlines()) for p in (ROOT / "wattline/cli").glob("*.py")}
    assert {name: n for name, n in sizes.items() if n > CLI_MAX_LINES} == {}


def oversized(root: Path) -> dict[str, int]:
    """Each hand-written module over :data:`MAX_LINES` (relative path -> lines), generated
    code (:data:`GENERATED`) and hidden folders (``bench/.venv``: CodeCarbon) aside."""
    found: dict[str, int] = {}
    for folder in SOURCE_FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            if any(part.startswith(".") for part in path.relative_to(root).parts):
                continue
            lines = len(path.read_text(encoding="utf-8").splitlines())
            if lines > MAX_LINES and not path.is_relative_to(root / GENERATED):
                found[path.relative_to(root).as_posix()] = lines
    return found


def test_no_module_outgrows_the_size_rule() -> None:
    assert oversized(ROOT) == {}


def test_the_size_check_finds_a_long_module(tmp_path: Path) -> None:
    """The check can fail: a module one line over is named, one at the limit and generated
    code are not."""
    for folder in ("wattline/agent/sources", "wattline/v1", "bench/.venv/lib"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "bench/.venv/lib/installed.py").write_text("x = 1\n" * 2 * MAX_LINES)
    (tmp_path / "wattline/agent/sources/long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (tmp_path / "bench/edge.py").write_text("x = 1\n" * MAX_LINES)
    (tmp_path / "wattline/v1/telemetry_pb2.py").write_text("x = 1\n" * 2 * MAX_LINES)
    assert oversized(tmp_path) == {"wattline/agent/sources/long.py": MAX_LINES + 1}
