"""Prometheus, Grafana Mimir and Thanos as a full store: remote write in, the HTTP API out."""
