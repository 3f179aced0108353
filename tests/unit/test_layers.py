"""The README's layers hold in the source: imports point down only (:data:`FLOORS`: cli 5 ->
accounting, jobs, reports, sweep, reference 4 -> collector 3 -> stores, agent 2 ->
wattline/*.py 1; agent and stores never import each other), no module takes a private name
from another package, and no module outgrows the size rule. Floor 4's rooms have floors of
their own (:data:`ROOMS`); no module imports another in a circle, type-only imports
included, and each name is imported from the module that defines it."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: Package -> floor; a module belongs to the longest package its name starts with, and a
#: module of ``wattline`` itself (``wire``, ``config``, ...) to floor 1.
FLOORS = {
    "wattline.cli": 5,
    "wattline.accounting": 4,
    "wattline.jobs": 4,
    "wattline.reports": 4,
    "wattline.sweep": 4,
    "wattline.reference": 4,
    "wattline.workloads": 4,
    "wattline.collector": 3,
    "wattline.stores": 2,
    "wattline.agent": 2,
}
#: Floor 4's rooms -> floor: a room imports its own and lower rooms only; accounting and jobs
#: share the lowest and do not import each other (the jobs' wrappers stand above the reports
#: they print; the sweep and the reference workloads above all; the deprecated
#: ``wattline.workloads`` forwards the Job API).
ROOMS = {
    "wattline.accounting": 1,
    "wattline.jobs": 1,
    "wattline.reports": 2,
    "wattline.reports.output": 3,
    "wattline.reports.summaries": 4,
    "wattline.jobs.wrappers": 5,
    "wattline.sweep": 6,
    "wattline.reference": 7,
    "wattline.workloads": 8,
}
#: The public surface's one upward import: ``from wattline import Job`` (imported on first
#: use, so that ``import wattline.wire`` does not load the Job API).
PUBLIC = {("wattline", "wattline.jobs.wrappers")}
#: Most lines a CLI module may hold (#21: the CLI only parses and calls).
CLI_MAX_LINES = 450
#: Most lines any hand-written module may hold (#21: each piece in its one place).
MAX_LINES = 450
#: Folders of hand-written code, and the generated one among them.
SOURCE_FOLDERS = ("wattline", "bench", "grafana")
GENERATED = "wattline/v1"


def _longest(module: str, table: dict[str, int]) -> str | None:
    hits = [p for p in table if module == p or module.startswith(p + ".")]
    return max(hits, key=len) if hits else None


def package_of(module: str) -> tuple[str, int] | None:
    """(package, floor) of a ``wattline`` module; None outside wattline."""
    if module.split(".")[0] != "wattline":
        return None
    package = _longest(module, FLOORS)
    return (package, FLOORS[package]) if package else ("wattline", 1)


def modules(root: Path) -> Iterator[tuple[Path, str]]:
    """Every hand-written module under ``root/wattline``: (file, dotted name)."""
    for path in sorted((root / "wattline").rglob("*.py")):
        if path.is_relative_to(root / GENERATED):
            continue
        parts = path.relative_to(root).with_suffix("").parts
        yield path, ".".join(parts).removesuffix(".__init__")


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
    """One line per import that points up or across a floor, or takes another package's
    private name."""
    found: list[str] = []
    for path, module in modules(root):
        own = package_of(module)
        assert own is not None
        for target, names, line in imports(path, module):
            other = package_of(target)
            if other is None or (module, _longest(target, ROOMS)) in PUBLIC:
                continue
            where = f"{path.relative_to(root)}:{line} imports {target}"
            if other[1] > own[1] or (own[1] == other[1] != 4 and own[0] != other[0]):
                found.append(f"{where}: floor {own[1]} imports floor {other[1]}")
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            if private and other[0] != own[0]:
                found.append(f"{where}: private {', '.join(private)}")
    return found


def room_of(module: str) -> tuple[str, int]:
    """(room, floor) of a floor-4 module."""
    room = _longest(module, ROOMS) or ""
    return room.removeprefix("wattline."), ROOMS.get(room, 0)


def module_imports(root: Path) -> Iterator[tuple[Path, str, str, int]]:
    """(file, module, imported wattline module, line) for every import between wattline
    modules, ``TYPE_CHECKING`` ones included; ``from package import module`` imports the
    module."""
    for path, module in modules(root):
        for target, names, line in imports(path, module):
            if target.split(".")[0] != "wattline":
                continue
            for name in names or [""]:
                sub = f"{target}.{name}"
                folder = root / sub.replace(".", "/")
                is_module = bool(name) and (folder.is_dir() or folder.with_suffix(".py").exists())
                yield path, module, sub if is_module else target, line


def room_violations(root: Path) -> list[str]:
    """One line per floor-4 import that points up a room or across the lowest rooms."""
    found: list[str] = []
    for path, module, target, line in module_imports(root):
        if package_of(module)[1] != 4 or package_of(target)[1] != 4:  # type: ignore[index]
            continue
        (room, floor), (other, other_floor) = room_of(module), room_of(target)
        if other_floor > floor or (floor == other_floor and room != other):
            found.append(
                f"{path.relative_to(root)}:{line} imports {target}: {room} {floor} imports {other} {other_floor}"
            )
    return sorted(set(found))


def import_cycles(root: Path) -> list[list[str]]:
    """Each circle of imports among wattline modules, type-only ones included (each found
    once, from its first module in sorted order)."""
    graph: dict[str, set[str]] = {}
    for _path, module, target, _line in module_imports(root):
        if target != module and (module, _longest(target, ROOMS)) not in PUBLIC:
            graph.setdefault(module, set()).add(target)
    found: list[list[str]] = []

    def walk(start: str, node: str, trail: list[str]) -> None:
        for nxt in sorted(graph.get(node, ())):
            if nxt == start:
                found.append([*trail, start])
            elif nxt > start and nxt not in trail:
                walk(start, nxt, [*trail, nxt])

    for start in sorted(graph):
        walk(start, start, [start])
    return found


def imported_from_elsewhere(root: Path) -> list[str]:
    """One line per name taken from a wattline module that does not define it (a forward)."""
    defined: dict[str, set[str]] = {}
    for path, module in modules(root):
        body = ast.parse(path.read_text(encoding="utf-8")).body
        names = {n.name for n in body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
        for node in body:
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, ast.AnnAssign)
                else []
            )
            names |= {x.id for t in targets for x in ast.walk(t) if isinstance(x, ast.Name)}
        defined[module] = names
    found: list[str] = []
    for path, module in modules(root):
        for target, names, line in imports(path, module):
            if target.startswith("wattline.") and target in defined:
                for name in names:
                    if name not in defined[target] and f"{target}.{name}" not in defined:
                        found.append(f"{path.relative_to(root)}:{line} takes {name} from {target}")
    return found


def test_imports_point_down_and_take_no_private_names() -> None:
    assert violations(ROOT) == []


def test_the_check_finds_an_upward_import_and_a_private_name(tmp_path: Path) -> None:
    """The check can fail: a tree with each mistake is caught, naming the file and line."""
    for folder in ("wattline/agent", "wattline/cli", "wattline/reports", "wattline/stores"):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
    (tmp_path / "wattline/units.py").write_text("from wattline.agent.counter import EnergyCounter\n")
    (tmp_path / "wattline/agent/uplink.py").write_text("import os\n\nfrom wattline.stores import base\n")
    (tmp_path / "wattline/stores/base.py").write_text("from wattline.collector import replay\n")
    (tmp_path / "wattline/cli/report.py").write_text("def f():\n    from wattline.reports.render import _iso\n")
    (tmp_path / "wattline/reports/render.py").write_text("from .build import _window\n")  # same package: allowed
    assert violations(tmp_path) == [
        "wattline/agent/uplink.py:3 imports wattline.stores: floor 2 imports floor 2",
        "wattline/cli/report.py:2 imports wattline.reports.render: private _iso",
        "wattline/stores/base.py:1 imports wattline.collector: floor 2 imports floor 3",
        "wattline/units.py:1 imports wattline.agent.counter: floor 1 imports floor 2",
    ]


def test_rooms_import_down_without_circles_or_forwards() -> None:
    assert room_violations(ROOT) == []
    assert import_cycles(ROOT) == []
    assert imported_from_elsewhere(ROOT) == []


def test_the_room_checks_find_an_upward_import_a_circle_and_a_forward(tmp_path: Path) -> None:
    """The checks can fail: each mistake is caught, naming the file and line; an import for
    type checking only closes a circle too."""
    for room in ("accounting", "jobs/wrappers", "reports/output", "agent"):
        (tmp_path / "wattline" / room).mkdir(parents=True)
    files = {
        "accounting/attribution.py": "from wattline.jobs.events import SATURATED\nsplit = 1\n",
        "jobs/events.py": "SATURATED = 'saturated'\n",
        "reports/model.py": "from wattline.reports.report_json import report_json\nclass Report: ...\n",
        "reports/report_json.py": "from wattline.reports.build import Report\ndef report_json(): ...\n",
        "reports/build.py": "from wattline.reports.model import Report\n",
        "reports/spans.py": "from wattline.reports import build\n",
        "agent/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from wattline.agent.b import B\nclass A: ...\n",
        "agent/b.py": "from wattline.agent.a import A\nclass B: ...\n",
    }
    for name, text in files.items():
        (tmp_path / "wattline" / name).write_text(text)
    assert room_violations(tmp_path) == [
        "wattline/accounting/attribution.py:1 imports wattline.jobs.events: accounting 1 imports jobs 1"
    ]
    assert import_cycles(tmp_path) == [
        ["wattline.agent.a", "wattline.agent.b", "wattline.agent.a"],
        ["wattline.reports.build", "wattline.reports.model", "wattline.reports.report_json", "wattline.reports.build"],
    ]
    assert imported_from_elsewhere(tmp_path) == [
        "wattline/reports/report_json.py:1 takes Report from wattline.reports.build"
    ]
    (tmp_path / "wattline/reports/output/render.py").write_text("from wattline.jobs.wrappers.job import Job\n")
    assert room_violations(tmp_path)[-1].startswith(
        "wattline/reports/output/render.py:1 imports wattline.jobs.wrappers.job: reports.output 3 imports jobs.wrappers 5"
    )


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
