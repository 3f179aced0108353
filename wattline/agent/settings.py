"""The agent's settings (``[agent]`` table, ``WATTLINE_AGENT_*``, flags)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from wattline.agent.holders.slurm import records as slurm_records
from wattline.config import ConfigError, option

DEFAULT_SOURCES = ["rapl", "nvml", "neuron", "nic", "cpu_model"]


@dataclass
class AgentSettings:
    """Everything ``wattline agent`` needs besides the per-source tables."""

    host_id: str = option("", "Stable host identity (default: the hostname).")
    labels: dict[str, str] = option({}, "Host labels KEY=VALUE (instance_type, region, cluster); low cardinality.")
    interval: float = option(
        1.0,
        "Sampling interval in seconds (0.1 for 10 Hz); a counter that can wrap within it is reported unusable, "
        "not sampled.",
    )
    rediscover_interval: float = option(
        60.0,
        "Seconds between source rediscoveries: devices that appear are sampled, ones that vanish reported "
        "(0: only on SIGHUP to the agent).",
    )
    sysfs_root: Path = option(
        Path("/"),
        "Root under which /sys and /proc are read, and run/wattline (root's edge socket) is found: the host's / "
        "as this process sees it (a recorded tree in tests, /host in a container).",
    )
    sources: list[str] = option(list(DEFAULT_SOURCES), "Sources to try, in order (rapl,nvml,neuron,nic,cpu_model).")
    collectors: list[str] = option(
        ["127.0.0.1:50051"], "Collector addresses HOST:PORT, in preference order (fail over and back)."
    )
    batch_interval: float = option(
        1.5,
        "Seconds between batches sent to the collector: the longest a sample waits in the agent. "
        "Each push costs the agent a fixed amount of CPU (gRPC's per-call work, whatever the batch "
        "holds), so a longer interval costs less; raise it (5-10) where older data is fine.",
    )
    batch_max_samples: int = option(5000, "Most samples in one batch.")
    spool_max_batches: int = option(
        3600, "In-memory spool: unacknowledged batches kept while no collector answers; beyond, the oldest are dropped."
    )
    spool_dir: str = option(
        "",
        "Directory of the crash-safe disk spool; empty: $STATE_DIRECTORY/spool under systemd, else in memory; "
        "'memory' forces the in-memory spool.",
    )
    spool_max_mb: float = option(512.0, "Disk spool size bound in MiB; beyond, the oldest data is dropped.")
    spool_max_age: float = option(86400.0, "Disk spool age bound in seconds; older data is dropped.")
    outbox_dir: str = option(
        "",
        "Job-event outbox: wattline run / Job keep their events here until a collector acknowledges them, and "
        "records of the jobs they hold (holders/); the agent delivers what dead runs left and ends their jobs. "
        "Empty: $XDG_STATE_HOME/wattline/outbox, else "
        "~/.local/state/wattline/outbox.",
    )
    edge_socket: str = option(
        "",
        "Unix socket on which the agent ticks on request at jobs' open and close (wattline run, Job ask it), "
        "so their energy there is read, not apportioned. Empty: $RUNTIME_DIRECTORY/edge.sock under systemd; "
        "else an agent run as root serves /run/wattline/edge.sock (under sysfs_root; the folder made 0755), any "
        "other user $XDG_RUNTIME_DIR/wattline/edge.sock (made 0700), and a wrapper asks its user's, then root's. "
        "'off': neither serve nor ask.",
    )
    slurm_dir: str = option(
        slurm_records.DEFAULT_DIR,
        "Slurm hooks: where the prolog makes each job's events file (WATTLINE_EVENTS of its tasks, owned "
        "by the job's user) and the prolog and epilog leave the agent their notes; a directory of root's "
        "that users can read.",
    )
    prometheus_port: int | None = option(None, "Serve Prometheus metrics on this port (off when unset).")
    prometheus_addr: str = option("127.0.0.1", "Address for the Prometheus endpoint (0.0.0.0 to expose).")
    push_timeout: float = option(10.0, "Seconds to wait for a collector acknowledgement.")
    failback: float = option(30.0, "Seconds on a fallback collector before the preferred one is tried again.")
    tls: bool = option(False, "Connect over TLS (implied by tls_ca or tls_cert); system CA roots unless tls_ca is set.")
    tls_ca: Path | None = option(None, "CA certificate (PEM) that signed the collector's certificate; enables TLS.")
    tls_cert: Path | None = option(None, "Client certificate (PEM) for mutual TLS; its CN or a DNS SAN is the host_id.")
    tls_key: Path | None = option(None, "Private key (PEM) of tls_cert; a file of mode 0600.")
    tls_server_name: str = option("", "Name expected in the collector's certificate (default: the address's host).")
    token_file: Path | None = option(
        None, "File holding the bearer token (mode 0600); else env WATTLINE_TOKEN. Never a flag value."
    )

    @property
    def uses_tls(self) -> bool:
        return self.tls or self.tls_ca is not None or self.tls_cert is not None

    def validate(self) -> AgentSettings:
        """Range checks; raises ConfigError naming the option."""
        if not self.sysfs_root.is_dir():  # a mistyped root would read as "no sources" on every host
            raise ConfigError(f"option agent.sysfs_root: {str(self.sysfs_root)[:200]!r} is not a directory")
        if not 0.001 <= self.interval <= 3600:
            raise ConfigError(f"option agent.interval: {self.interval} s out of range (0.001..3600)")
        if not 0 <= self.rediscover_interval <= 86400:
            raise ConfigError(f"option agent.rediscover_interval: {self.rediscover_interval} s out of range (0..86400)")
        if self.batch_interval <= 0:
            raise ConfigError("option agent.batch_interval: must be positive")
        if self.batch_max_samples < 1 or self.spool_max_batches < 1:
            raise ConfigError("option agent.batch_max_samples/spool_max_batches: must be at least 1")
        if self.prometheus_port is not None and not 0 <= self.prometheus_port <= 65535:
            raise ConfigError(f"option agent.prometheus_port: {self.prometheus_port} is not a port")
        if not self.collectors:
            raise ConfigError("option agent.collectors: at least one collector HOST:PORT is needed")
        for address in self.collectors:
            host, sep, port = address.rpartition(":")
            if "/" in address:  # a URL: gRPC takes HOST:PORT (TLS comes from tls_ca, not a scheme)
                raise ConfigError(
                    f"option agent.collectors: {address[:100]!r} is a URL, not HOST:PORT (drop the scheme)"
                )
            if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
                raise ConfigError(f"option agent.collectors: {address!r} is not HOST:PORT")
        if self.spool_max_mb <= 0 or self.spool_max_age <= 0:
            raise ConfigError("option agent.spool_max_mb/spool_max_age: must be positive")
        if self.push_timeout <= 0 or self.failback <= 0:
            raise ConfigError("option agent.push_timeout/failback: must be positive")
        return self
