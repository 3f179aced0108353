"""``wattline slurm prolog|epilog|task-prolog [--config FILE]``: the Slurm hooks' commands.

The hooks in ``deploy/slurm/`` call this module's :func:`main` with ``HOOK --config FILE``;
it parses that itself, so a hook loads no CLI library (every job start waits for the
Prolog). ``wattline slurm ...`` (typer, :func:`register`) calls the same :func:`hook`.
Whatever happens, a hook exits 0 (a failing Prolog drains the node) and says what went
wrong in one line on stderr, which slurmd logs.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

TYPE_CHECKING = False  # typing's own flag costs a hook the typing module
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    import typer

HOOKS = ("prolog", "epilog", "task-prolog")
USAGE = "usage: wattline slurm prolog|epilog|task-prolog [--config FILE]"


def hook(name: str, config: Path | None, env: Mapping[str, str] | None = None) -> int:
    """Run hook ``name``; always 0. TaskProlog's ``export`` lines go to stdout."""
    env = os.environ if env is None else env
    job = env.get("SLURM_JOB_ID", "?")[:20]
    try:
        from wattline.jobs.wrappers import slurm_hooks

        run: dict[str, Callable[[Mapping[str, str], Path | None], list[str]]] = {
            "prolog": slurm_hooks.prolog,
            "epilog": slurm_hooks.epilog,
            "task-prolog": slurm_hooks.task_prolog,
        }
        lines = run[name](env, config)
        if name == "task-prolog":
            print("\n".join(lines), flush=True)
            lines = []
        problems = lines
    except Exception as exc:  # whatever it is, the job and the node go on
        problems = [f"{type(exc).__name__}: {exc}" if not str(exc) else str(exc)]
    for problem in problems:
        print(f"wattline slurm {name}: job {job}: {' '.join(problem.split())[:500]}", file=sys.stderr, flush=True)
    return 0


def parse(argv: list[str]) -> tuple[str, Path | None] | None:
    """(hook, config) of ``HOOK [--config FILE]``; None when that is not what ``argv`` says."""
    if not argv or argv[0] not in HOOKS:
        return None
    rest, config = argv[1:], None
    if len(rest) == 2 and rest[0] == "--config":
        config = Path(rest[1])
    elif len(rest) == 1 and rest[0].startswith("--config="):
        config = Path(rest[0].partition("=")[2])
    elif rest:
        return None
    return argv[0], config


def main(argv: list[str]) -> int:
    """The hooks' entry; a usage error is one line, still exit 0 (it runs as a Slurm hook)."""
    parsed = parse(argv)
    if parsed is None:
        print(f"wattline slurm: {USAGE}", file=sys.stderr)
        return 0
    return hook(*parsed)


def register(root: typer.Typer) -> None:
    """Add the ``slurm`` command group to ``root``."""
    import typer

    from wattline.cli import panels

    app = typer.Typer(
        cls=panels.PanelGroup,
        help="Slurm hooks: every Slurm job a wattline job (docs/operations/slurm.md); each exits 0.",
    )

    def command(name: str) -> None:
        def run(
            config: Path | None = typer.Option(
                None,
                "--config",
                help="The node's agent config; {node}: $SLURMD_NODENAME.",
                rich_help_panel=panels.STORE,
            ),
        ) -> None:
            raise typer.Exit(hook(name, config))

        run.__doc__ = {
            "prolog": "Open the job on this node (Slurm Prolog, as root, PrologFlags=Alloc).",
            "epilog": "Count the job's events file and close the job on this node (Slurm Epilog, as root).",
            "task-prolog": "Print the exports that let a task report units (Slurm TaskProlog, as the user).",
        }[name]
        app.command(name, cls=panels.PanelCommand)(run)

    for name in HOOKS:
        command(name)
    root.add_typer(app, name="slurm", rich_help_panel=panels.OPERATE)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
