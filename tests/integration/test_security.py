"""TLS, mutual TLS with per-host identity, bearer tokens, and the refusals around them.

A throwaway CA, a collector certificate and two agent certificates (plus a rogue CA and
its agent) are made at test time with the ``openssl`` command-line tool.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from pki import make_ca, make_cert
from servers import free_port, make_batch
from store_rows import energy_rows
from sysfs_trees import Zone, powercap_tree
from typer.testing import CliRunner

from wattline import wire
from wattline.agent.assembly import uplink_security
from wattline.agent.settings import AgentSettings
from wattline.agent.uplink import channel_options
from wattline.cli.main import app
from wattline.collector.server import CollectorServer
from wattline.collector.settings import CollectorSettings
from wattline.config import ConfigError
from wattline.security import TokenCheck, channel_credentials, is_loopback, read_token, server_credentials
from wattline.stores.sqlite.store import SqliteStore

TOKEN = "s3cr3t-t0ken-0123456789abcdef"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    make_ca(d, "ca")
    make_ca(d, "rogue-ca")
    make_cert(d, "collector", "ca", "subjectAltName=DNS:localhost,DNS:collector.test,IP:127.0.0.1\n")
    for host in ("host-a", "host-b"):
        make_cert(d, host, "ca", f"subjectAltName=DNS:{host}\nextendedKeyUsage=clientAuth\n")
    make_cert(d, "rogue", "rogue-ca", "subjectAltName=DNS:host-a\nextendedKeyUsage=clientAuth\n")
    token = d / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    return d


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    with SqliteStore(tmp_path / "w.db") as s:
        yield s


def serve(store: SqliteStore, pki: Path, *, mtls: bool = False, token: str | None = None) -> CollectorServer:
    creds = server_credentials(pki / "collector.pem", pki / "collector.key", pki / "ca.pem" if mtls else None)
    server = CollectorServer(store, "127.0.0.1:0", server_credentials=creds, token=token, require_identity=mtls)
    server.start()
    return server


def push(
    port: int,
    creds: grpc.ChannelCredentials | None,
    host: str = "host-a",
    metadata: tuple[tuple[str, str], ...] = (),
    server_name: str | None = None,
) -> grpc.StatusCode:
    """Push one batch; the status code (OK when acknowledged)."""
    address = f"127.0.0.1:{port}"
    options = channel_options(server_name)
    channel = grpc.insecure_channel(address) if creds is None else grpc.secure_channel(address, creds, options)
    try:
        wire.telemetry_stub(channel).Push(make_batch(host=host, stream=f"s-{host}"), timeout=10, metadata=metadata)
        return grpc.StatusCode.OK
    except grpc.RpcError as exc:
        return exc.code()  # type: ignore[no-any-return,attr-defined]
    finally:
        channel.close()


def refused(server: CollectorServer, reason: str) -> float | None:
    return server.registry.get_sample_value("wattline_collector_refused_calls_total", {"reason": reason})


def test_tls_encrypts_and_authenticates_the_collector(pki: Path, store: SqliteStore) -> None:
    server = serve(store, pki)
    try:
        assert push(server.port, channel_credentials(pki / "ca.pem")) == grpc.StatusCode.OK
        assert push(server.port, None) == grpc.StatusCode.UNAVAILABLE  # plaintext to a TLS port
        assert push(server.port, channel_credentials(pki / "rogue-ca.pem")) == grpc.StatusCode.UNAVAILABLE
        name_ok = push(server.port, channel_credentials(pki / "ca.pem"), server_name="collector.test")
        assert name_ok == grpc.StatusCode.OK
        name_bad = push(server.port, channel_credentials(pki / "ca.pem"), server_name="elsewhere.test")
        assert name_bad == grpc.StatusCode.UNAVAILABLE
    finally:
        server.stop()
    assert len(energy_rows(store, host="host-a")) == 4


def test_mutual_tls_a_host_writes_only_as_itself(pki: Path, store: SqliteStore) -> None:
    server = serve(store, pki, mtls=True)
    a = channel_credentials(pki / "ca.pem", pki / "host-a.pem", pki / "host-a.key")
    try:
        assert push(server.port, a, host="host-a") == grpc.StatusCode.OK
        assert push(server.port, a, host="host-b") == grpc.StatusCode.PERMISSION_DENIED  # impersonation
        b = channel_credentials(pki / "ca.pem", pki / "host-b.pem", pki / "host-b.key")
        assert push(server.port, b, host="host-b") == grpc.StatusCode.OK
        no_cert = channel_credentials(pki / "ca.pem")
        assert push(server.port, no_cert, host="host-a") == grpc.StatusCode.UNAVAILABLE  # handshake refused
        rogue = channel_credentials(pki / "ca.pem", pki / "rogue.pem", pki / "rogue.key")
        assert push(server.port, rogue, host="host-a") == grpc.StatusCode.UNAVAILABLE  # names host-a, wrong CA
        refused = server.registry.get_sample_value(
            "wattline_collector_refused_calls_total", {"reason": "permission_denied"}
        )
        assert refused == 1
    finally:
        server.stop()
    assert {r["host"] for r in energy_rows(store)} == {"host-a", "host-b"}


def test_bearer_token(pki: Path, store: SqliteStore, caplog: pytest.LogCaptureFixture) -> None:
    server = serve(store, pki, token=TOKEN)
    creds = channel_credentials(pki / "ca.pem")
    try:
        with caplog.at_level(logging.DEBUG):
            assert push(server.port, creds) == grpc.StatusCode.UNAUTHENTICATED
            wrong = (("authorization", "Bearer " + TOKEN[:-1] + "X"),)
            assert push(server.port, creds, metadata=wrong) == grpc.StatusCode.UNAUTHENTICATED
            assert push(server.port, creds, metadata=(("authorization", TOKEN),)) == grpc.StatusCode.UNAUTHENTICATED
            right = (("authorization", "Bearer " + TOKEN),)
            assert push(server.port, creds, metadata=right) == grpc.StatusCode.OK
        assert "missing or wrong bearer token" in caplog.text
        assert TOKEN not in caplog.text and TOKEN[:-1] not in caplog.text  # never logged
        refused = server.registry.get_sample_value(
            "wattline_collector_refused_calls_total", {"reason": "unauthenticated"}
        )
        assert refused == 3
        # Probes carry no credentials: the health service stays open.
        channel = grpc.secure_channel(f"127.0.0.1:{server.port}", creds)
        answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
        channel.close()
    finally:
        server.stop()
    assert len(energy_rows(store, host="host-a")) == 4


def test_token_check_is_exact() -> None:
    check = TokenCheck(TOKEN)
    assert check.check([("authorization", f"Bearer {TOKEN}")])
    assert check.check([("x-other", "1"), ("Authorization", f"Bearer {TOKEN}".encode())])
    for value in ("", "Bearer", f"Bearer {TOKEN} ", f"bearer {TOKEN}", f"Bearer {TOKEN}x"):
        assert not check.check([("authorization", value)]), value
    assert not check.check(None)
    assert TOKEN not in repr(check)


def test_agent_settings_wire_tls_and_token(pki: Path, store: SqliteStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """What ``wattline agent`` builds from its settings is accepted by an mTLS + token collector."""
    monkeypatch.delenv("WATTLINE_TOKEN", raising=False)
    server = serve(store, pki, mtls=True, token=TOKEN)
    settings = AgentSettings(
        collectors=[f"localhost:{server.port}"],
        tls_ca=pki / "ca.pem",
        tls_cert=pki / "host-b.pem",
        tls_key=pki / "host-b.key",
        token_file=pki / "token",
    )
    security = uplink_security(settings.validate())
    try:
        metadata = (("authorization", f"Bearer {security.token}"),)
        assert push(server.port, security.credentials, host="host-b", metadata=metadata) == grpc.StatusCode.OK
    finally:
        server.stop()


def test_secrets_refuse_loose_permissions(pki: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loose_key = tmp_path / "collector.key"
    loose_key.write_bytes((pki / "collector.key").read_bytes())
    loose_key.chmod(0o640)
    with pytest.raises(ConfigError, match=r"collector.tls_key file .*: permissions 0o640 too open; chmod 600"):
        server_credentials(pki / "collector.pem", loose_key)
    loose_token = tmp_path / "token"
    loose_token.write_text(TOKEN)
    loose_token.chmod(0o604)
    with pytest.raises(ConfigError, match=r"agent.token_file file .*: permissions 0o604 too open"):
        read_token(loose_token, "agent.token_file")
    loose_token.chmod(0o600)
    assert read_token(loose_token) == TOKEN
    loose_token.write_text("short")
    with pytest.raises(ConfigError, match="shorter than 16 characters"):
        read_token(loose_token)
    monkeypatch.setenv("WATTLINE_TOKEN", "with space but long enough")
    with pytest.raises(ConfigError, match="environment variable WATTLINE_TOKEN: the token must be printable ASCII"):
        read_token(None)
    with pytest.raises(ConfigError, match=r"agent.tls_cert/tls_key: set both"):
        channel_credentials(pki / "ca.pem", pki / "host-a.pem", None)
    with pytest.raises(ConfigError, match=r"agent.tls_ca file .*absent.pem: No such file"):
        channel_credentials(tmp_path / "absent.pem")


def test_collector_refuses_plaintext_beyond_loopback() -> None:
    with pytest.raises(ConfigError, match=r"option collector.listen: plaintext gRPC on 0.0.0.0:50051, beyond loopback"):
        CollectorSettings(listen="0.0.0.0:50051").validate()
    CollectorSettings(listen="0.0.0.0:50051", insecure_listen=True).validate()
    CollectorSettings(listen="0.0.0.0:50051", tls_cert=Path("c.pem"), tls_key=Path("c.key")).validate()
    for loopback in ("127.0.0.1:50051", "localhost:1", "[::1]:50051", "127.0.0.2:9"):
        CollectorSettings(listen=loopback).validate()
    with pytest.raises(ConfigError, match="tls_client_ca: mutual TLS needs tls_cert and tls_key"):
        CollectorSettings(tls_client_ca=Path("ca.pem")).check_tls()


def test_agent_refuses_a_token_in_clear_text(pki: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATTLINE_TOKEN", TOKEN)
    remote = AgentSettings(collectors=["127.0.0.1:50051", "collector.example:50051"])
    with pytest.raises(ConfigError, match=r"token would cross the network in clear text to collector.example:50051"):
        uplink_security(remote)
    assert uplink_security(AgentSettings(collectors=["127.0.0.1:50051"])).token == TOKEN
    tls = AgentSettings(collectors=["collector.example:50051"], tls_ca=pki / "ca.pem")
    assert uplink_security(tls).credentials is not None


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("127.0.0.1:1", True),
        ("127.9.9.9:1", True),
        ("localhost:1", True),
        ("[::1]:1", True),
        ("unix:/run/w.sock", True),
        ("0.0.0.0:1", False),
        ("[::]:1", False),
        ("10.0.0.1:1", False),
        ("collector:1", False),
        ("localhost.example.com:1", False),
    ],
)
def test_is_loopback(address: str, loopback: bool) -> None:
    assert is_loopback(address) is loopback


def metrics_text(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


def test_tokens_never_show_in_help_logs_metrics_or_errors(tmp_path: Path) -> None:
    """A collector holding a token from a file and an agent sending another from the
    environment (refused, again and again) at debug level: neither token appears in
    ``--help``, the log lines, either ``/metrics``, nor the error line of a refused token."""
    tree = powercap_tree(tmp_path / "host", [Zone("intel-rapl:0", "package-0", 10**9)])
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    other = "0th3r-s3cr3t-t0ken-fedcba9876543210"
    port, collector_metrics, agent_metrics = free_port(), free_port(), free_port()
    cli = [sys.executable, "-m", "wattline.cli.main", "--log-level", "debug"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("WATTLINE_")}
    collector = subprocess.Popen(
        [*cli, "collector", "--listen", f"127.0.0.1:{port}", "--store", f"sqlite:///{tmp_path / 'w.db'}",
         "--token-file", str(token_file), "--prometheus-port", str(collector_metrics)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    agent = subprocess.Popen(
        [*cli, "agent", "--host-id", "host-a", "--sysfs-root", str(tree), "--source", "rapl",
         "--interval", "0.1", "--batch-interval", "0.2", "--collector", f"127.0.0.1:{port}",
         "--spool-dir", "memory", "--prometheus-port", str(agent_metrics)],
        env={**env, "WATTLINE_TOKEN": other}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    seen = ""
    try:
        deadline = time.monotonic() + 30
        refused = 'wattline_collector_refused_calls_total{reason="unauthenticated"}'
        while time.monotonic() < deadline and not re.search(re.escape(refused) + r" [1-9]", seen):
            time.sleep(0.2)
            with contextlib.suppress(OSError):
                seen = metrics_text(collector_metrics)
        assert re.search(re.escape(refused) + r" [1-9]", seen), "the agent's pushes were never refused"
        seen += metrics_text(agent_metrics)
    finally:
        agent.terminate()
        collector.terminate()
        logs = agent.communicate(timeout=20)[0] + collector.communicate(timeout=20)[0]
    assert "bearer token" in logs  # the refusals were logged (at debug level: everything there is)
    runner = CliRunner()
    outputs = [
        runner.invoke(app, [c, "--help"], env={"WATTLINE_TOKEN": TOKEN, "COLUMNS": "200"}).output
        for c in ("agent", "collector")
    ]
    assert all("--token-file" in out for out in outputs)
    for bad in ("s3cr3t with a space 0123456789", "sh0rt-s3cr3t"):  # refused tokens: one line, not quoted
        out = subprocess.run(
            [*cli, "collector", "--store", f"sqlite:///{tmp_path / 'w.db'}"],
            env={**env, "WATTLINE_TOKEN": bad}, capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert out.returncode != 0 and "WATTLINE_TOKEN" in out.stderr and "Traceback" not in out.stderr
        outputs.append(out.stdout + out.stderr)
        assert bad not in out.stderr
    for text in [seen, logs, *outputs]:
        assert TOKEN not in text and other not in text


def test_cli_daemons_over_mutual_tls_with_a_token(pki: Path, tmp_path: Path) -> None:
    """``wattline collector`` and ``wattline agent`` as processes, wired by their flags only."""
    tree = powercap_tree(tmp_path / "host", [Zone("intel-rapl:0", "package-0", 10**9)])
    port = free_port()
    db = tmp_path / "w.db"
    cli = [sys.executable, "-m", "wattline.cli.main"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("WATTLINE_")}
    collector = subprocess.Popen(
        [*cli, "collector", "--listen", f"127.0.0.1:{port}", "--store", f"sqlite:///{db}",
         "--tls-cert", str(pki / "collector.pem"), "--tls-key", str(pki / "collector.key"),
         "--tls-client-ca", str(pki / "ca.pem"), "--token-file", str(pki / "token")],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    agent = subprocess.Popen(
        [*cli, "agent", "--host-id", "host-a", "--sysfs-root", str(tree), "--source", "rapl",
         "--interval", "0.1", "--batch-interval", "0.2", "--collector", f"localhost:{port}",
         "--tls-ca", str(pki / "ca.pem"), "--tls-cert", str(pki / "host-a.pem"),
         "--tls-key", str(pki / "host-a.key"), "--token-file", str(pki / "token"), "--spool-dir", "memory"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        rows: list[dict[str, object]] = []
        while time.monotonic() < deadline and len(rows) < 5:
            time.sleep(0.3)
            if db.exists():
                with SqliteStore(db) as s:
                    rows = energy_rows(s, host="host-a")
        assert len(rows) >= 5, "nothing arrived over mutual TLS"
    finally:
        agent.terminate()  # first: it flushes to the collector
        _, agent_err = agent.communicate(timeout=30)
        collector.terminate()
        _, collector_err = collector.communicate(timeout=30)
    assert agent.returncode == 0 and collector.returncode == 0, agent_err + collector_err
    assert "over TLS" in agent_err and "mutual TLS, bearer token" in collector_err
    assert TOKEN not in agent_err + collector_err
