"""Unix-socket servers side by side: the name a second instance binds, and what each removes."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

from deviceplugin.node.unixgrpc import UnixServer, free_path, listening


def _nothing(server: object) -> None:
    return None


def test_free_path_skips_only_sockets_a_server_listens_on(tmp_path: Path) -> None:
    preferred = tmp_path / "nvidia-gpu.sock"
    assert free_path(preferred) == preferred  # nothing there
    preferred.write_text("a stray file")
    assert free_path(preferred) == preferred  # replaced as before
    preferred.unlink()
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(preferred))
    dead.close()  # a socket file nobody listens on, as a killed process leaves it
    assert not listening(preferred)
    assert free_path(preferred) == preferred
    preferred.unlink()
    with socket.socket(socket.AF_UNIX) as live:
        live.bind(str(preferred))
        live.listen()
        assert listening(preferred)
        assert free_path(preferred) == tmp_path / "nvidia-gpu-1.sock"


def test_two_servers_side_by_side_each_remove_only_their_own(tmp_path: Path) -> None:
    async def body() -> None:
        preferred = tmp_path / "dra.sock"
        first, second = UnixServer(preferred, beside_others=True), UnixServer(preferred, True)
        await first.start(_nothing)
        await second.start(_nothing)
        assert (first.socket, second.socket) == (preferred, tmp_path / "dra-1.sock")
        assert first.owns_socket and second.owns_socket
        await first.stop(0)
        assert not preferred.exists() and second.owns_socket
        third = UnixServer(preferred, beside_others=True)
        await third.start(_nothing)  # the preferred name is free again
        assert third.socket == preferred
        await second.stop(0)
        await third.stop(0)
        assert list(tmp_path.iterdir()) == []

    asyncio.run(body())


def test_without_beside_others_a_server_replaces_whatever_is_there(tmp_path: Path) -> None:
    async def body() -> None:
        preferred = tmp_path / "x.sock"
        first, second = UnixServer(preferred), UnixServer(preferred)
        await first.start(_nothing)
        await second.start(_nothing)
        assert second.socket == preferred and second.owns_socket and not first.owns_socket
        await second.stop(0)
        await first.stop(0)

    asyncio.run(body())
