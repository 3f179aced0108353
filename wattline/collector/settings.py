"""The collector's settings (``[collector]`` table, ``WATTLINE_COLLECTOR_*``, flags)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from wattline.config import ConfigError, option
from wattline.security import is_loopback, read_token, server_credentials
from wattline.share_rules import DEFAULT_SHARE_RULE, SHARE_RULE_HELP, check_share_rule

if TYPE_CHECKING:  # only an annotation here: the command line reads these settings without loading gRPC
    import grpc

DEFAULT_STORE = "sqlite:///var/lib/wattline/wattline.db"


#: A Mimir tenant id (Thanos and Cortex take the same): at most 150 of these characters, not
#: "." or ".."; several joined by "|" (Mimir's queries across tenants).
_ORG_ID = re.compile(r"[A-Za-z0-9!_.*'()-]{1,150}")


def check_tenant(tenant: str, name: str, store: str = "") -> None:
    """ConfigError unless ``tenant`` is empty, the ``X-Scope-OrgID`` of a ``prometheus+`` ``store``,
    or VictoriaMetrics' ACCOUNT[:PROJECT] (uint32s)."""
    if store.lower().startswith("prometheus+"):
        if tenant and not all(_ORG_ID.fullmatch(t) and t not in (".", "..") for t in tenant.split("|")):
            raise ConfigError(
                f"option {name}: {tenant[:100]!r} is not a tenant id (at most 150 of A-Z a-z 0-9 !-_.*'(), "
                "several joined by |)"
            )
        return
    parts = tenant.split(":") if tenant else []
    if len(parts) > 2 or not all(p.isascii() and p.isdigit() and int(p) < 2**32 for p in parts):
        raise ConfigError(f"option {name}: {tenant[:100]!r} is not ACCOUNT or ACCOUNT:PROJECT (numbers below 2^32)")


@dataclass
class CollectorSettings:
    """Everything ``wattline collector`` needs."""

    listen: str = option(
        "127.0.0.1:50051", "gRPC listen address HOST:PORT (non-loopback needs TLS, see docs/security.md)."
    )
    store: str = option(
        DEFAULT_STORE,
        "Where to write: sqlite:///PATH (embedded default), http(s)://influxdb:8086, http://victoriametrics:8428, "
        "http://prometheus:9090 or prometheus+http(s)://HOST[/PREFIX][?write=PATH|URL] (Prometheus, Mimir, Thanos).",
    )
    influx_api: str = option("auto", "InfluxDB write API: auto (from /ping), v1 (/write) or v2 (/api/v2/write).")
    influx_database: str = option("wattline", "InfluxDB 1.x database (created if missing).")
    influx_org: str = option("wattline", "InfluxDB 2.x/3.x organization.")
    influx_bucket: str = option("wattline", "InfluxDB 2.x/3.x bucket.")
    influx_token_file: Path | None = option(
        None, "File holding the InfluxDB token (mode 600); else env WATTLINE_INFLUX_TOKEN. Never a flag value."
    )
    influx_username: str = option("", "InfluxDB 1.x user (password from env WATTLINE_INFLUX_PASSWORD).")
    tenant: str = option(
        "",
        "VictoriaMetrics cluster tenant ACCOUNT or ACCOUNT:PROJECT: the store URL serves vminsert's "
        "/insert/<tenant>/influx/ and vmselect's /select/<tenant>/prometheus/ (vmauth in front of both); "
        "empty: a single node. With a prometheus+http(s) store: the X-Scope-OrgID sent (Mimir, Thanos).",
    )
    prometheus_port: int | None = option(None, "Serve the collector's own Prometheus metrics on this port.")
    prometheus_addr: str = option("127.0.0.1", "Address for the Prometheus endpoint.")
    workers: int = option(
        8,
        "Concurrent group commits (SQLite: 1); 64 calls per worker may wait for them; "
        "a batch no writer takes within 1 s is answered 'busy'.",
    )
    processes: int = option(
        1,
        "Collector processes sharing the listen port (0: one per core); more than 1 needs an InfluxDB store.",
    )
    max_message_mb: int = option(16, "Largest accepted batch, MiB.")
    max_batch_points: int = option(20000, "Most samples + job events in one batch (agents split larger ones).")
    host_rate: float = option(20.0, "Batches per second one host may push (token bucket); 0: no limit.")
    host_burst: float = option(60.0, "Batches one host may push at once before host_rate applies.")
    tls_cert: Path | None = option(None, "Server certificate (PEM); with tls_key, gRPC is served over TLS.")
    tls_key: Path | None = option(None, "Private key (PEM) of tls_cert; a file of mode 0600.")
    tls_client_ca: Path | None = option(
        None, "CA (PEM) of the agents' certificates: mutual TLS, and each host writes only as its certificate's name."
    )
    token_file: Path | None = option(
        None, "File holding the bearer token agents must send (mode 0600); else env WATTLINE_TOKEN."
    )
    insecure_listen: bool = option(
        False, "Allow plaintext gRPC on a non-loopback listen address (a network protected otherwise)."
    )
    summaries: bool = option(
        True,
        "Write each job's summary (measurement job_summary) when its close arrives, and every "
        "summary_interval while it runs; needs a store reports read (InfluxDB 1.x API, VictoriaMetrics, "
        "Prometheus or SQLite).",
    )
    summary_interval: float = option(60.0, "Seconds between summaries of a running job.")
    service_interval: float = option(
        60.0,
        "Seconds of each interval of a service job summarised in the store (measurement service_interval), "
        "aligned to wall-clock multiples (1 to 86400); 0: none written (written when summaries is on).",
    )
    summary_wait: float = option(
        6.0, "Seconds after a close to wait for the job's last samples before its summary is written incomplete."
    )
    summary_idle: str = option("none", "Summary idle policy: none (total energy) or subtract (above the baseline).")
    summary_share_rule: str = option(DEFAULT_SHARE_RULE, "Summaries' rule. " + SHARE_RULE_HELP)
    summary_price: float | None = option(None, "Instance price for summaries' cost figures, USD per instance-hour.")
    summary_carbon_intensity: float | None = option(None, "Grid carbon intensity for summaries' CO2, gCO2/kWh.")
    summary_pue: float = option(1.0, "Power usage effectiveness applied to summaries' CO2 (>= 1).")
    slurm_admin_comment: bool = option(
        False,
        "Write each closed Slurm job's summary to its AdminComment in Slurm's accounting (sacctmgr, as root or "
        "SlurmUser: a host with Slurm's client, its munge key and slurm.conf); docs/operations/slurm.md.",
    )
    slurm_admin_comment_timeout: float = option(
        10.0, "Seconds each sacctmgr of slurm_admin_comment may take (slurmdbd down or slow: retried with back-off)."
    )
    replay_dir: str = option(
        "",
        "Directory of the replay log: what the collector wrote to a store that acknowledges a write before it is "
        "durable (VictoriaMetrics), kept until it is and written again if the store lost it; empty: "
        "$STATE_DIRECTORY/replay under systemd, else $XDG_STATE_HOME/wattline/replay, else "
        "~/.local/state/wattline/replay.",
    )
    replay_max_mb: int = option(256, "Most MiB the replay log keeps (a store down that long): beyond, the oldest go.")

    def validate(self) -> CollectorSettings:
        """Range checks; raises ConfigError naming the option (pairs of TLS files: :meth:`check_tls`)."""
        host, sep, port = self.listen.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ConfigError(f"option collector.listen: {self.listen!r} is not HOST:PORT")
        if self.influx_api not in {"auto", "v1", "v2"}:
            raise ConfigError(f"option collector.influx_api: {self.influx_api!r} is not auto, v1 or v2")
        check_tenant(self.tenant, "collector.tenant", self.store)
        if self.workers < 1 or self.max_message_mb < 1 or self.max_batch_points < 1:
            raise ConfigError("option collector.workers/max_message_mb/max_batch_points: must be at least 1")
        if self.processes < 0:
            raise ConfigError(f"option collector.processes: {self.processes} is negative (0: one per core)")
        if self.process_count() > 1 and not self.store.lower().startswith(("http://", "https://", "prometheus+")):
            raise ConfigError(
                f"option collector.processes: {self.process_count()} processes cannot share a SQLite store "
                "(one writer per file); use processes = 1, or an InfluxDB store (http://...)"
            )
        if self.host_rate < 0 or self.host_burst < 1:
            raise ConfigError("option collector.host_rate/host_burst: rate >= 0 and burst >= 1")
        if self.summary_idle not in {"none", "subtract"}:
            raise ConfigError(f"option collector.summary_idle: {self.summary_idle!r} is not none or subtract")
        check_share_rule(self.summary_share_rule, "collector.summary_share_rule")
        if self.replay_max_mb < 1:
            raise ConfigError(f"option collector.replay_max_mb: {self.replay_max_mb} is below 1")
        if not self.slurm_admin_comment_timeout > 0:
            raise ConfigError("option collector.slurm_admin_comment_timeout: need > 0")
        if not (self.service_interval == 0 or 1 <= self.service_interval <= 86400):
            raise ConfigError("option collector.service_interval: need 0 (none) or 1 to 86400 seconds")
        if not self.summary_interval > 0 or not self.summary_wait >= 0 or not self.summary_pue >= 1:
            raise ConfigError("option collector.summary_interval/summary_wait/summary_pue: need > 0, >= 0 and >= 1")
        prices = (("summary_price", self.summary_price), ("summary_carbon_intensity", self.summary_carbon_intensity))
        for name, value in prices:
            if value is not None and not value >= 0:
                raise ConfigError(f"option collector.{name}: {value} is negative")
        if self.tls_cert is None and not self.insecure_listen and not is_loopback(self.listen):
            raise ConfigError(
                f"option collector.listen: plaintext gRPC on {self.listen}, beyond loopback: set tls_cert and "
                "tls_key, or insecure_listen = true (--insecure-listen) on a network protected otherwise"
            )
        return self

    def process_count(self) -> int:
        """How many collector processes: ``processes``, or one per core this process may use."""
        return self.processes or len(os.sched_getaffinity(0))

    def credentials(self) -> tuple[grpc.ServerCredentials | None, str | None]:
        """The server's TLS credentials and the agents' bearer token, read and checked: a
        bad key or a loose token file fails here, before anything is opened."""
        self.check_tls()
        creds = None
        if self.tls_cert is not None and self.tls_key is not None:
            creds = server_credentials(self.tls_cert, self.tls_key, self.tls_client_ca)
        return creds, read_token(self.token_file, "collector.token_file")

    def replay_root(self, env: Mapping[str, str] | None = None) -> Path:
        """Where the replay logs are (``replay_dir``, else the state directory's ``replay``);
        ConfigError when no state directory is known (no home)."""
        if self.replay_dir:
            return Path(self.replay_dir).expanduser()
        env = os.environ if env is None else env
        if state := env.get("STATE_DIRECTORY", "").split(":")[0]:
            return Path(state) / "replay"
        if (xdg := env.get("XDG_STATE_HOME", "")) and Path(xdg).is_absolute():
            return Path(xdg) / "wattline" / "replay"
        try:
            return Path(env.get("HOME") or Path.home()) / ".local" / "state" / "wattline" / "replay"
        except (RuntimeError, KeyError):
            raise ConfigError("no home directory for the replay log: set collector.replay_dir") from None

    def check_tls(self) -> None:
        """The TLS options go together: cert with key, a client CA only with both."""
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("option collector.tls_cert/tls_key: set both (the certificate and its key) or neither")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ConfigError("option collector.tls_client_ca: mutual TLS needs tls_cert and tls_key")
