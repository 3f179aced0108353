"""The environment variables that tell a job's processes their job (``Job(...)`` joins it)
and events file, and the label naming whose job it is; apart from :mod:`.events` so a Slurm
TaskProlog names them without loading it."""

from __future__ import annotations

from collections.abc import Mapping

ENV_JOB_ID = "WATTLINE_JOB_ID"
ENV_EVENTS = "WATTLINE_EVENTS"

#: The label naming who ran a job: the Slurm hooks' (``SLURM_JOB_USER``), a wrapper's own user.
USER_LABEL = "user"


def local_user() -> str:
    """This process's user name (its uid where no name is known, as in a container)."""
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        import os

        return str(os.getuid())


def with_owner(labels: Mapping[str, str] | None) -> dict[str, str]:
    """``labels`` with :data:`USER_LABEL` set to :func:`local_user` unless they name one (a
    wrapped job's, for ``wattline jobs --mine``; a label anyone can set: a filter, not a proof)."""
    return {USER_LABEL: local_user(), **(labels or {})}
