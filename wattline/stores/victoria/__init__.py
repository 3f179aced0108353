"""VictoriaMetrics (single node) as a full store: line protocol in, the Prometheus HTTP API out."""
