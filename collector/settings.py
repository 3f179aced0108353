"""The collector's settings (``[collector]`` table, ``WATTLINE_COLLECTOR_*``, flags)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from wattline.config import ConfigError, option

DEFAULT_STORE = "sqlite:///var/lib/wattline/wattline.db"


@dataclass
class CollectorSettings:
    """Everything ``wattline collector`` needs."""

    listen: str = option(
        "127.0.0.1:50051", "gRPC listen address HOST:PORT (non-loopback needs TLS, see README Security)."
    )
    store: str = option(DEFAULT_STORE, "Where to write: sqlite:///PATH (embedded default) or http(s)://influxdb:8086.")
    influx_api: str = option("auto", "InfluxDB write API: auto (from /ping), v1 (/write) or v2 (/api/v2/write).")
    influx_database: str = option("wattline", "InfluxDB 1.x database (created if missing).")
    influx_org: str = option("wattline", "InfluxDB 2.x/3.x organization.")
    influx_bucket: str = option("wattline", "InfluxDB 2.x/3.x bucket.")
    influx_token_file: Path | None = option(
        None, "File holding the InfluxDB token (mode 600); else env WATTLINE_INFLUX_TOKEN. Never a flag value."
    )
    influx_username: str = option("", "InfluxDB 1.x user (password from env WATTLINE_INFLUX_PASSWORD).")
    prometheus_port: int | None = option(None, "Serve the collector's own Prometheus metrics on this port.")
    prometheus_addr: str = option("127.0.0.1", "Address for the Prometheus endpoint.")
    workers: int = option(8, "Concurrent batch writes (gRPC worker threads); more agents wait (back-pressure).")
    max_message_mb: int = option(16, "Largest accepted batch, MiB.")

    def validate(self) -> CollectorSettings:
        """Range checks; raises ConfigError naming the option."""
        host, sep, port = self.listen.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ConfigError(f"option collector.listen: {self.listen!r} is not HOST:PORT")
        if self.influx_api not in {"auto", "v1", "v2"}:
            raise ConfigError(f"option collector.influx_api: {self.influx_api!r} is not auto, v1 or v2")
        if self.workers < 1 or self.max_message_mb < 1:
            raise ConfigError("option collector.workers/max_message_mb: must be at least 1")
        return self
