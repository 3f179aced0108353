"""A bad flag, value or config file: ONE clear line on stderr naming the option, a non-zero
exit status, never a traceback.

The cases run as real ``wattline`` processes, all started at once (each one pays the
interpreter's start-up, not the others'); a second set goes through the same entry point
in-process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from wattline.cli.main import main

# (name, argv, config file text or None, expected exit status, expected text on the one line)
CASES = [
    ("bad-flag-value", ["agent", "--interval", "abc"], None, 2, "Invalid value for '--interval'"),
    ("malformed-toml", ["agent", "--config", "{config}"], "[agent\ninterval = 1\n", 2, "invalid TOML"),
    ("unknown-option-in-file", ["agent", "--config", "{config}"], "[agent]\nintervall = 1\n", 2,
     "config [agent]: unknown option 'intervall'"),
    ("listen-nonsense", ["collector", "--listen", "nonsense"], None, 2,
     "option collector.listen: 'nonsense' is not HOST:PORT"),
    ("run-without-command", ["run"], None, 2, "wattline run: Missing argument"),
    ("mistyped-sysfs-root", ["sources", "--sysfs-root", "/no/such/root"], None, 2,
     "option agent.sysfs_root: '/no/such/root' is not a directory"),
    ("run-mistyped-sysfs-root", ["run", "--sysfs-root", "/no/such/root", "--", "true"], None, 2,
     "option agent.sysfs_root: '/no/such/root' is not a directory"),
]  # fmt: skip


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, subprocess.CompletedProcess[str]]:
    """Every case's process, run concurrently."""
    root = tmp_path_factory.mktemp("cli")
    env = {k: v for k, v in os.environ.items() if not k.startswith("WATTLINE_")}
    env["COLUMNS"] = "80"
    procs = {}
    for name, argv, config, _, _ in CASES:
        path = root / f"{name}.toml"
        if config is not None:
            path.write_text(config)
        args = [a.format(config=path) for a in argv]
        procs[name] = (
            args,
            subprocess.Popen(
                [sys.executable, "-m", "wattline.cli.main", *args],
                cwd=root,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            ),
        )
    done = {}
    for name, (args, proc) in procs.items():
        out, err = proc.communicate(timeout=60)
        done[name] = subprocess.CompletedProcess(args, proc.returncode, out, err)
    return done


@pytest.mark.parametrize(("name", "status", "text"), [(c[0], c[3], c[4]) for c in CASES], ids=[c[0] for c in CASES])
def test_one_line_and_a_status(
    results: dict[str, subprocess.CompletedProcess[str]], name: str, status: int, text: str
) -> None:
    result = results[name]
    assert result.returncode == status, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("wattline: error: ") and text in lines[0], lines[0]
    assert result.stdout == ""


def run_main(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """``wattline argv...`` through the console entry point, in this process: (status, stderr)."""
    monkeypatch.setattr(sys, "argv", ["wattline", *argv])
    with pytest.raises(SystemExit) as exit_info:
        main()
    code = exit_info.value.code
    return (code if isinstance(code, int) else 1), capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "env", "status", "text"),
    [
        (["agent", "--interval", "0"], {}, 2, "option agent.interval: 0.0 s out of range"),
        (["agent", "--collector", "nohost"], {}, 2, "option agent.collectors: 'nohost' is not HOST:PORT"),
        (["agent", "--spool-max-mb", "-1"], {}, 2, "option agent.spool_max_mb/spool_max_age: must be positive"),
        (["agent"], {"WATTLINE_AGENT_INTERVAL": "fast"}, 2, "option WATTLINE_AGENT_INTERVAL: invalid value 'fast'"),
        (["agent", "--bogus"], {}, 2, "wattline agent: No such option: --bogus"),
        (["collector", "--listen", "0.0.0.0:50051"], {}, 2, "option collector.listen: plaintext gRPC on 0.0.0.0:50051"),
        (["collector", "--workers", "0"], {}, 2, "must be at least 1"),
        (["collector", "--service-interval", "0.5"], {}, 2, "option collector.service_interval: need 0 (none) or 1"),
        (["collector", "--service-interval", "inf"], {}, 2, "option collector.service_interval: need 0 (none) or 1"),
        (["collector", "--workers", "x"], {}, 2, "Invalid value for '--workers'"),
        (["collector", "--store", "ftp://x/y"], {}, 1, "unsupported store URL 'ftp://x/y'"),
        (["collector", "--tls-cert", "/absent/c.pem"], {}, 2, "collector.tls_cert/tls_key: set both"),
        (["collector", "--tls-cert", "/absent/c.pem", "--tls-key", "/absent/c.key"], {}, 2,
         "collector.tls_cert file /absent/c.pem: No such file or directory"),
        (["--log-level", "loud", "sources"], {}, 2, "option --log-level: 'loud'"),
        (["collector", "--config", "{config}"], {}, 2,
         "option collector.workers: invalid value 'many' (expected an integer)"),
        (["report"], {}, 2, "wattline report: Missing argument"),
    ],
)  # fmt: skip
def test_in_process_entry_point(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    argv: list[str],
    env: dict[str, str],
    status: int,
    text: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "bad.toml"
    config.write_text("[collector]\nworkers = 'many'\n")
    argv = [a.format(config=config) for a in argv]
    for key in [k for k in os.environ if k.startswith("WATTLINE_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    code, err = run_main(monkeypatch, capsys, *argv)
    assert code == status, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("wattline: error: ") and text in lines[0], err


@pytest.mark.parametrize(
    "tls", [["--tls-cert", "/absent/c.pem"], ["--tls-cert", "/absent/c.pem", "--tls-key", "/absent/k"]]
)
def test_bad_tls_fails_before_the_store_is_opened(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path, tls: list[str]
) -> None:
    """A TLS mistake is the line the user sees (exit 2), and nothing is created: the summary
    writer must not open (here: create) the store first."""
    db = tmp_path / "store" / "w.db"
    code, err = run_main(monkeypatch, capsys, "collector", "--store", f"sqlite:///{db}", *tls)
    assert code == 2 and "collector.tls_" in err, err
    assert not db.parent.exists()


def test_loose_token_file_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("0123456789abcdef0123")
    token.chmod(0o644)
    code, err = run_main(monkeypatch, capsys, "agent", "--token-file", str(token))
    assert code == 2
    assert err == f"wattline: error: agent.token_file file {token}: permissions 0o644 too open; chmod 600 {token}\n"


def test_help_and_version_still_exit_zero(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    code, _ = run_main(monkeypatch, capsys, "--version")
    assert code == 0
    code, err = run_main(monkeypatch, capsys, "collector", "--help")
    assert code == 0 and err == ""
    code, _ = run_main(monkeypatch, capsys)  # no command: the help, as a usage error
    assert code == 2


@pytest.mark.parametrize(
    "argv",
    [["agent"], ["collector"], ["sources"], ["run"], ["report"], ["jobs"], ["compare"],
     ["workload", "layoutlm-inference"], ["workload", "bert-pretrain"]],
)  # fmt: skip
def test_config_help_names_its_tables(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    """``[agent]`` is a TOML table, not rich markup: every --config help shows it."""
    monkeypatch.setenv("COLUMNS", "250")
    monkeypatch.setattr(sys, "argv", ["wattline", *argv, "--help"])
    with pytest.raises(SystemExit) as exit_info:
        main()
    out = " ".join(capsys.readouterr().out.split())
    assert exit_info.value.code == 0
    assert "TOML config file ([agent], [collector], [sources.NAME] tables)" in out, out
