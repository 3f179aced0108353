"""wattline: energy telemetry for machine-learning fleets.

Floor 1 (this package's own modules: ``wire``, ``config``, ``units``) imports nothing
else of the project; ``agent``, ``collector`` (floor 2), ``workloads`` (floor 3) and
``cli`` (floor 4) build on it. See docs/architecture.md.
"""

__version__ = "0.1.0"
