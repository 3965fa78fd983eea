"""gRPC servers on unix sockets, started and stopped the same way by every front-end.

The kubelet reaches each plugin API (device plugin, DRA, plugin registration) over a unix
socket in a directory it owns; a socket file left by a crashed run must be removed before
binding, and a stopped server's socket removed so the kubelet stops dialling it.

A path that still exists is not necessarily still ours: the kubelet (or anyone) may delete our
socket and put something else there, a regular file or another process's socket. `UnixServer`
remembers the device and inode of the socket it bound, so `owns_socket` tells its own socket
from whatever replaced it (the caller then serves again, which replaces the stranger), and stop
removes the path only while it is still that socket. A path longer than a unix socket allows is
refused before binding, with the path and its length (`SocketPathError`).
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable
from pathlib import Path

import grpc

from deviceplugin.model.errors import DevicePluginError

# Allocate requests can name thousands of IDs; the default 4 MiB would refuse the largest ones.
SERVER_OPTIONS = (("grpc.max_receive_message_length", 16 * 1024 * 1024),)
MAX_SOCKET_PATH = 107  # bytes: sockaddr_un.sun_path holds 108, with the terminating NUL

SocketIdentity = tuple[int, int]  # (st_dev, st_ino)


class SocketPathError(DevicePluginError):
    """A unix socket path is longer than the kernel allows."""


def socket_path_problem(socket: Path) -> str | None:
    """Why `socket` cannot be a unix socket path, or None."""
    size = len(os.fsencode(socket))
    if size > MAX_SOCKET_PATH:
        return f"{socket} is {size} bytes long; a unix socket path holds at most {MAX_SOCKET_PATH}"
    return None


def socket_identity(path: Path) -> SocketIdentity | None:
    """(device, inode) of the unix socket at `path`; None when there is none (or not a socket)."""
    try:
        info = path.lstat()
    except OSError:
        return None
    return (info.st_dev, info.st_ino) if stat.S_ISSOCK(info.st_mode) else None


async def listen_unix(
    socket: Path, add_services: Callable[[grpc.aio.Server], None]
) -> grpc.aio.Server:
    """A started grpc.aio server on a unix socket; whatever is at the path is removed first.
    Raises SocketPathError for a path too long to bind."""
    problem = socket_path_problem(socket)
    if problem is not None:
        raise SocketPathError(problem)
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


class UnixServer:
    """One grpc.aio server on `socket`, and whether that path is still the socket it bound."""

    def __init__(self, socket: Path) -> None:
        self.socket = socket
        self._server: grpc.aio.Server | None = None
        self._identity: SocketIdentity | None = None

    @property
    def serving(self) -> bool:
        return self._server is not None

    @property
    def owns_socket(self) -> bool:
        """The path is the socket this server bound: not deleted, not replaced."""
        return self._identity is not None and socket_identity(self.socket) == self._identity

    async def start(self, add_services: Callable[[grpc.aio.Server], None]) -> None:
        """Listen (whatever is at the path is replaced); returns once calls are accepted.
        Raises SocketPathError."""
        self._server = await listen_unix(self.socket, add_services)
        self._identity = socket_identity(self.socket)

    async def stop(self, grace: float | None) -> None:
        """Stop serving; remove the path only while it is still our socket."""
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace)
        if self.owns_socket:
            with contextlib.suppress(FileNotFoundError):
                self.socket.unlink()
        self._identity = None
