"""gRPC servers on unix sockets, started and stopped the same way by every front-end.

The kubelet reaches each plugin API (device plugin, DRA, plugin registration) over a unix
socket in a directory it owns; a socket file left by a crashed run must be removed before
binding, and a stopped server's socket removed so the kubelet stops dialling it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

import grpc

# Allocate requests can name thousands of IDs; the default 4 MiB would refuse the largest ones.
SERVER_OPTIONS = (("grpc.max_receive_message_length", 16 * 1024 * 1024),)


async def listen_unix(
    socket: Path, add_services: Callable[[grpc.aio.Server], None]
) -> grpc.aio.Server:
    """A started grpc.aio server on a unix socket; a stale socket file is removed first."""
    with contextlib.suppress(FileNotFoundError):
        socket.unlink()
    server = grpc.aio.server(options=list(SERVER_OPTIONS))
    add_services(server)
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    return server


async def close_unix(server: grpc.aio.Server | None, socket: Path, grace: float | None) -> None:
    """Stop `server` (if any) and remove its socket file."""
    if server is not None:
        await server.stop(grace)
    with contextlib.suppress(FileNotFoundError):
        socket.unlink()
