"""gRPC servers on unix sockets, started and stopped the same way by every front-end.

The kubelet reaches each plugin API (device plugin, DRA, plugin registration) over a unix
socket in a directory it owns; a socket file left by a crashed run must be removed before
binding, and a stopped server's socket removed so the kubelet stops dialling it.

Two instances of one server may run side by side during a rolling update: with `beside_others`
a server leaves a socket another live process serves on alone and binds a free name beside it.

A path that still exists is not necessarily still ours: the kubelet (or anyone) may delete our
socket and put something else there, a regular file or another process's socket. `UnixServer`
remembers the device and inode of the socket it bound, so `owns_socket` tells its own socket
from whatever replaced it (the caller then serves again, which replaces the stranger), and stop
removes the path only while it is still that socket. A path longer than a unix socket allows is
refused before binding, with the path and its length (`SocketPathError`).
"""

from __future__ import annotations

import contextlib
import socket as pysocket
import stat
from collections.abc import Callable
from pathlib import Path

import grpc

from deviceplugin.model.errors import DevicePluginError
from deviceplugin.model.hostpaths import socket_path_problem

# Allocate requests can name thousands of IDs; the default 4 MiB would refuse the largest ones.
SERVER_OPTIONS = (("grpc.max_receive_message_length", 16 * 1024 * 1024),)

SocketIdentity = tuple[int, int]  # (st_dev, st_ino)
LISTEN_PROBE_SECONDS = 0.5
MAX_INSTANCES = 8  # of one server on one node at a time: an update's old and new, and spares


class SocketPathError(DevicePluginError):
    """A unix socket path is longer than the kernel allows."""


def socket_identity(path: Path) -> SocketIdentity | None:
    """(device, inode) of the unix socket at `path`; None when there is none (or not a socket)."""
    try:
        info = path.lstat()
    except OSError:
        return None
    return (info.st_dev, info.st_ino) if stat.S_ISSOCK(info.st_mode) else None


def listening(path: Path, timeout: float = LISTEN_PROBE_SECONDS) -> bool:
    """A server accepts connections on the unix socket at `path` (a socket file left by a
    killed process refuses them)."""
    with (
        contextlib.suppress(OSError),
        pysocket.socket(pysocket.AF_UNIX, pysocket.SOCK_STREAM) as probe,
    ):
        probe.settimeout(timeout)
        probe.connect(str(path))
        return True
    return False


def free_path(preferred: Path) -> Path:
    """`preferred`, unless another process serves there: then the first of `<stem>-1<suffix>`,
    `<stem>-2<suffix>`, ... beside it that no server holds. A rolling update runs the old and
    the new instance side by side; the kubelet keeps both connected as long as each has its own
    socket, so neither has to stop serving before the other registers."""
    for path in _instance_paths(preferred):
        if socket_identity(path) is None or not listening(path):
            return path
    raise SocketPathError(f"{MAX_INSTANCES} servers already listen at {preferred} and beside it")


def others_listening(preferred: Path, own: Path) -> bool:
    """Another instance serves at `preferred` or beside it (not at `own`): a rolling update's
    other pod is still up."""
    return any(
        path != own and socket_identity(path) is not None and listening(path)
        for path in _instance_paths(preferred)
    )


def _instance_paths(preferred: Path) -> list[Path]:
    """`preferred`, then `<stem>-1<suffix>` ... : where the instances of one server bind."""
    return [
        preferred if n == 0 else preferred.with_name(f"{preferred.stem}-{n}{preferred.suffix}")
        for n in range(MAX_INSTANCES)
    ]


async def listen_unix(
    socket: Path, add_services: Callable[[grpc.aio.Server], None]
) -> grpc.aio.Server:
    """A started grpc.aio server on a unix socket; whatever is at the path is removed first.
    Raises SocketPathError for a path too long to bind."""
    problem = socket_path_problem(str(socket))
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
    """One grpc.aio server on `socket`, and whether that path is still the socket it bound.
    With `beside_others`, a socket another live server holds is left alone and the server
    binds the first free path beside it (`free_path`): `socket` then names the one bound."""

    def __init__(self, socket: Path, beside_others: bool = False) -> None:
        self.preferred = socket
        self.socket = socket
        self._beside_others = beside_others
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
        if self._beside_others:
            self.socket = free_path(self.preferred)
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
