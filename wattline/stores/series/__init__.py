"""wattline's points in the Prometheus data model, and reading them back through the
Prometheus HTTP API (VictoriaMetrics and Prometheus alike)."""
