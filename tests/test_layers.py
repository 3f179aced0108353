"""The README's layers hold in the source: imports point down only (cli 4 -> workloads 3 ->
agent, collector 2 -> wattline/*.py 1; agent and collector never import each other), no
module takes a private name from another package, and no module outgrows the size rule.
Inside workloads the rooms have floors of their own (:data:`ROOMS`), no module imports
another in a circle, and each name is imported from the module that defines it."""

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
#: Rooms of ``wattline/workloads`` -> floor: a room imports its own and lower floors' rooms
#: only; energy and jobs share floor 1 and do not import each other. Its other modules
#: (reference, sweep, demo, the package itself) stand above them all.
ROOMS = {"energy": 1, "jobs": 1, "report": 2, "output": 3, "services": 4, "wrappers": 5}
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


def room_of(module: str) -> tuple[str, int]:
    """(room, floor) of a ``wattline.workloads`` module."""
    room = module.split(".")[2] if module.count(".") >= 2 else ""
    return room, ROOMS.get(room, max(ROOMS.values()) + 1)


def workloads_imports(root: Path) -> Iterator[tuple[Path, str, str, int, bool]]:
    """(file, module, imported workloads module, line, at run time) for every import between
    workloads modules; one inside ``if TYPE_CHECKING:`` is not at run time."""
    for path, module in modules(root):
        if not module.startswith("wattline.workloads"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        typing_only = {
            getattr(n, "lineno", 0)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING")
            for n in ast.walk(node)
        }
        for target, names, line in imports(path, module):
            if target.startswith("wattline.workloads"):
                for name in names or [""]:  # `from package import module` imports the module
                    sub = f"{target}.{name}"
                    folder = root / sub.replace(".", "/")
                    is_module = bool(name) and (folder.is_dir() or folder.with_suffix(".py").exists())
                    yield path, module, sub if is_module else target, line, line not in typing_only


def room_violations(root: Path) -> list[str]:
    """One line per workloads import that points up a floor or across floor 1."""
    found: list[str] = []
    for path, module, target, line, _run in workloads_imports(root):
        (room, floor), (other, other_floor) = room_of(module), room_of(target)
        if other_floor > floor or (floor == other_floor == 1 and room != other):
            found.append(
                f"{path.relative_to(root)}:{line} imports {target}: {room} {floor} imports {other} {other_floor}"
            )
    return sorted(set(found))


def import_cycles(root: Path) -> list[list[str]]:
    """Each circle of run-time imports among workloads modules (each found once, from its
    first module in sorted order)."""
    graph: dict[str, set[str]] = {}
    for _path, module, target, _line, run in workloads_imports(root):
        if run and target != module:
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
    """One line per name taken from a workloads module that does not define it (a forward)."""
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
            if target.startswith("wattline.workloads.") and target in defined:
                for name in names:
                    if name not in defined[target] and f"{target}.{name}" not in defined:
                        found.append(f"{path.relative_to(root)}:{line} takes {name} from {target}")
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


def test_workloads_rooms_import_down_without_circles_or_forwards() -> None:
    assert room_violations(ROOT) == []
    assert import_cycles(ROOT) == []
    assert imported_from_elsewhere(ROOT) == []


def test_the_room_checks_find_an_upward_import_a_circle_and_a_forward(tmp_path: Path) -> None:
    """The checks can fail: each mistake is caught, naming the file and line; an import for
    type checking only is no circle."""
    for folder in PACKAGES:
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
    for room in ("energy", "jobs", "report", "output"):
        (tmp_path / "wattline/workloads" / room).mkdir()
    files = {
        "energy/attribution.py": "from wattline.workloads.jobs.events import SATURATED\nsplit = 1\n",
        "jobs/events.py": "SATURATED = 'saturated'\n",
        "report/model.py": "from wattline.workloads.report.report_json import report_json\nclass Report: ...\n",
        "report/report_json.py": "from wattline.workloads.report.build import Report\ndef report_json(): ...\n",
        "report/build.py": "from wattline.workloads.report.model import Report\n",
        "report/spans.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from wattline.workloads.report.model import Report\n",
        "output/render.py": "from wattline.workloads.report import spans\n",
    }
    for name, text in files.items():
        (tmp_path / "wattline/workloads" / name).write_text(text)
    (tmp_path / "wattline/workloads/report/model.py").write_text(files["report/model.py"])
    assert room_violations(tmp_path) == [
        "wattline/workloads/energy/attribution.py:1 imports wattline.workloads.jobs.events: energy 1 imports jobs 1"
    ]
    assert import_cycles(tmp_path) == [
        [
            "wattline.workloads.report.build",
            "wattline.workloads.report.model",
            "wattline.workloads.report.report_json",
            "wattline.workloads.report.build",
        ]
    ]
    assert imported_from_elsewhere(tmp_path) == [
        "wattline/workloads/report/report_json.py:1 takes Report from wattline.workloads.report.build"
    ]
    (tmp_path / "wattline/workloads/output/render.py").write_text("from wattline.workloads.wrappers.job import Job\n")
    assert room_violations(tmp_path)[-1].startswith(
        "wattline/workloads/output/render.py:1 imports wattline.workloads.wrappers.job: output 3 imports wrappers 5"
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
