from servers import influxd, victoria_metrics  # noqa: F401
