"""The environment variables that tell a job's processes their job (``Job(...)`` joins it)
and events file; apart from :mod:`.events` so a Slurm TaskProlog names them without loading it."""

ENV_JOB_ID = "WATTLINE_JOB_ID"
ENV_EVENTS = "WATTLINE_EVENTS"
