"""Services held by systemd units named in the agent's config (``[systemd]``)."""
