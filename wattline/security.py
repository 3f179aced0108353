"""Transport security shared by the agent and the collector: TLS, bearer tokens, identities.

Model (docs/security.md):

- **TLS** (``tls_cert`` + ``tls_key`` on the collector; ``tls_ca`` on the agent, or the
  system roots) encrypts the gRPC stream and authenticates the collector to the agent.
  ``tls_server_name`` overrides the name the agent checks in the collector's certificate.
- **Mutual TLS** (``tls_client_ca`` on the collector; ``tls_cert`` + ``tls_key`` on the
  agent): only agents with a certificate from that CA connect, and a host can write only
  under its own identity: the certificate's CN or a DNS SAN must equal
  ``batch.host.host_id`` (else PERMISSION_DENIED).
- **Bearer token** (``token_file`` on both, or ``$WATTLINE_TOKEN``): the agent sends
  ``authorization: Bearer <token>``; the collector compares digests in constant time
  (else UNAUTHENTICATED). A token proves membership of the fleet, not a host identity.
- The collector refuses plaintext on a non-loopback listen address unless told
  ``insecure_listen`` (a network where something else protects the traffic), and the
  agent refuses to send a token in clear text beyond loopback.

Secrets (token, private keys) come only from files refused when group/world accessible,
or from the environment; they never appear in argv, logs or ``--help``.

Floor 1: imports nothing of the project but :mod:`wattline.config`.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from wattline.config import ConfigError, read_public_file, read_secret, read_secret_bytes

__all__ = [
    "AUTH_METADATA",
    "TOKEN_ENV",
    "TokenCheck",
    "bearer_metadata",
    "channel_credentials",
    "is_loopback",
    "peer_identities",
    "read_token",
    "server_credentials",
]

if TYPE_CHECKING:  # imported where credentials are made: loading gRPC is a large part of a command's start
    import grpc

#: gRPC metadata key of the bearer token (lower case, as HTTP/2 carries it).
AUTH_METADATA = "authorization"
#: Environment variable holding the token when no token file is configured.
TOKEN_ENV = "WATTLINE_TOKEN"
#: Shortest accepted token: anything shorter is guessable.
MIN_TOKEN_CHARS = 16


def is_loopback(address: str) -> bool:
    """Whether ``HOST:PORT`` (or ``[v6]:PORT``, ``unix:PATH``) stays on this machine."""
    if address.startswith(("unix:", "unix-abstract:")):
        return True
    host = address.rpartition(":")[0] if ":" in address else address
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve anywhere


def read_token(path: Path | None, what: str = "token") -> str | None:
    """The bearer token from ``path`` (mode 0600) or ``$WATTLINE_TOKEN``; None when neither is set."""
    token = read_secret(path, TOKEN_ENV, what)
    if token is None:
        return None
    where = f"{what} file {path}" if path is not None else f"environment variable {TOKEN_ENV}"
    if len(token) < MIN_TOKEN_CHARS:
        raise ConfigError(f"{where}: the token is shorter than {MIN_TOKEN_CHARS} characters")
    if not token.isascii() or not token.isprintable() or any(c.isspace() for c in token):
        raise ConfigError(f"{where}: the token must be printable ASCII without spaces")
    return token


def bearer_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """Call metadata carrying ``token`` (empty without one)."""
    return ((AUTH_METADATA, f"Bearer {token}"),) if token else ()


class TokenCheck:
    """Constant-time check of ``authorization: Bearer <token>`` metadata."""

    def __init__(self, token: str) -> None:
        import hashlib  # here, not at the top: the agent (a client) never checks a token
        import hmac

        self._sha256, self._equal = hashlib.sha256, hmac.compare_digest
        self._digest = hashlib.sha256(f"Bearer {token}".encode()).digest()

    def __repr__(self) -> str:
        return "TokenCheck(<redacted>)"

    def check(self, metadata: Iterable[tuple[str, str | bytes]] | None) -> bool:
        """True when one ``authorization`` value is exactly ``Bearer <token>``."""
        ok = False
        for key, value in metadata or ():
            if key.lower() != AUTH_METADATA:
                continue
            raw = value if isinstance(value, bytes) else value.encode("utf-8", "replace")
            # Digests of equal length: the comparison time depends on neither content nor length.
            ok |= self._equal(self._sha256(raw).digest(), self._digest)
        return ok


def server_credentials(cert: Path, key: Path, client_ca: Path | None = None) -> grpc.ServerCredentials:
    """TLS credentials of the collector; with ``client_ca``, clients must present a certificate it signed."""
    chain = read_public_file(cert, "collector.tls_cert")
    private = read_secret_bytes(key, "collector.tls_key")
    roots = read_public_file(client_ca, "collector.tls_client_ca") if client_ca is not None else None
    import grpc

    try:
        return grpc.ssl_server_credentials([(private, chain)], root_certificates=roots, require_client_auth=bool(roots))
    except (ValueError, RuntimeError) as exc:
        raise ConfigError(f"option collector.tls_cert/tls_key: {exc}") from None


def channel_credentials(ca: Path | None, cert: Path | None = None, key: Path | None = None) -> grpc.ChannelCredentials:
    """TLS credentials of the agent: ``ca`` (else the system roots), and a client certificate for mTLS."""
    if (cert is None) != (key is None):
        raise ConfigError("option agent.tls_cert/tls_key: set both (the client certificate and its key) or neither")
    roots = read_public_file(ca, "agent.tls_ca") if ca is not None else None
    chain = read_public_file(cert, "agent.tls_cert") if cert is not None else None
    private = read_secret_bytes(key, "agent.tls_key") if key is not None else None
    import grpc

    return grpc.ssl_channel_credentials(root_certificates=roots, private_key=private, certificate_chain=chain)


def peer_identities(auth_context: Mapping[str, Any]) -> set[str]:
    """The names a verified client certificate vouches for: its CN and its SANs."""
    names: set[str] = set()
    for key in ("x509_common_name", "x509_subject_alternative_name"):
        for value in auth_context.get(key, ()):
            names.add(value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value))
    return names
