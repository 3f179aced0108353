"""The listen address: resolved once, and checked free before gRPC binds it (gRPC's own
failure is a C-core log line and a message about GRPC_VERBOSITY; this one names the cause)."""

from __future__ import annotations

import socket

from wattline.config import ConfigError

Address = tuple[socket.AddressFamily, socket.SocketKind, int, tuple[object, ...]]


def resolve(listen: str) -> Address:
    """``HOST:PORT`` (``[v6]:PORT``) as (family, kind, proto, socket address)."""
    host, _, port_text = listen.rpartition(":")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host.strip("[]"), int(port_text), type=socket.SOCK_STREAM)[
            0
        ]
    except (socket.gaierror, ValueError) as exc:
        raise ConfigError(f"option collector.listen: cannot resolve {listen[:100]!r}: {exc}") from None
    return family, kind, proto, address


def check_free(listen: str) -> Address:
    """Raise OSError naming the cause when something listens on ``listen``'s port (port 0:
    nothing to check); returns the resolved address."""
    family, kind, proto, address = resolved = resolve(listen)
    if address[1]:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                raise OSError(f"cannot listen on {listen}: {exc.strerror}") from None
    return resolved
