"""Throwaway certificate authorities and certificates for TLS tests, made with the ``openssl`` CLI."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca(d: Path, name: str) -> None:
    """A self-signed CA: ``d/NAME.pem`` and its key ``d/NAME.key``."""
    openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2", "-subj", f"/CN=wattline test {name}",
        cwd=d,
    )  # fmt: skip


def make_cert(d: Path, name: str, ca: str, ext: str) -> None:
    """``d/NAME.pem`` (and key) signed by CA ``ca`` in ``d``, with the extensions ``ext`` (openssl extfile lines)."""
    (d / f"{name}.ext").write_text(ext)
    openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}",
        cwd=d,
    )  # fmt: skip
    openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
        "-set_serial", str(int.from_bytes(os.urandom(8), "big")), "-days", "2",
        "-out", f"{name}.pem", "-extfile", f"{name}.ext",
        cwd=d,
    )  # fmt: skip
    (d / f"{name}.key").chmod(0o600)
