"""Two driver processes on one node (a rolling update runs both for a while): Prepare and
Unprepare wait for the node's lock another process holds, a holder killed releases it, and each
driver starts from the checkpoint as the other left it, so a device is never prepared for two
claims."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from deviceplugin.dra.checkpoint import Checkpoint, read_boot_id
from deviceplugin.dra.nodelock import LockTimeout, NodeLock
from deviceplugin.dra.prepare import ClaimRef, Preparer
from tests.draplugin import DRIVER, NODE, claim, run, running_driver, short_dir

HOLD = """
import fcntl, sys
with open(sys.argv[1], "a") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    print("held", flush=True)
    sys.stdin.read()
"""


@asynccontextmanager
async def held_elsewhere(path: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    """Another process holding the lock on `path` until its stdin closes."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        HOLD,
        str(path),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None and process.stdin is not None
    try:
        assert await asyncio.wait_for(process.stdout.readline(), 30) == b"held\n"
        yield process
    finally:
        if process.returncode is None:
            process.stdin.close()
        await process.wait()


def test_the_lock_waits_for_another_process_and_gives_up_naming_the_file() -> None:
    async def body() -> None:
        path = short_dir("lock") / "checkpoint.lock"
        async with held_elsewhere(path) as holder:
            with pytest.raises(LockTimeout, match=f"another process has held {path}"):
                async with NodeLock(path, timeout=0.2).held():
                    pass
            waiting = asyncio.ensure_future(_hold_once(NodeLock(path, timeout=30)))
            await asyncio.sleep(0.2)
            assert not waiting.done()
            assert holder.stdin is not None
            holder.stdin.close()
            await asyncio.wait_for(waiting, 30)

    run(body)


def test_a_holder_killed_releases_the_lock() -> None:
    async def body() -> None:
        path = short_dir("lock") / "checkpoint.lock"
        async with held_elsewhere(path) as holder:
            holder.send_signal(signal.SIGKILL)
            await holder.wait()
            await _hold_once(NodeLock(path, timeout=5))

    run(body)


async def _hold_once(lock: NodeLock) -> None:
    async with lock.held():
        pass


def test_prepare_waits_while_another_driver_process_holds_the_node() -> None:
    async def body() -> None:
        async with running_driver() as node:
            ref = node.add_claim(claim("waits", [("gpu", "gpu-4")]))
            lock = node.kubelet_root / "plugins" / DRIVER / "checkpoint.lock"
            async with held_elsewhere(lock) as holder:
                call = asyncio.ensure_future(node.watcher.prepare(DRIVER, [ref]))
                await asyncio.sleep(0.3)
                assert not call.done()
                assert not list(node.cdi_dir.glob("*.json"))
                assert holder.stdin is not None
                holder.stdin.close()
                response = await asyncio.wait_for(call, 30)
            assert response.claims[ref[2]].error == ""

    run(body)


def test_a_second_driver_sees_what_the_first_prepared_and_unprepared() -> None:
    async def body() -> None:
        async with running_driver() as node:
            first = node.add_claim(claim("first", [("gpu", "gpu-4")]))
            second = node.add_claim(claim("second", [("gpu", "gpu-4")]))
            assert (await node.watcher.prepare(DRIVER, [first])).claims[first[2]].error == ""
            assert node.driver.preparer is not None
            other = Preparer(
                _Claims(node.server.claims),
                Checkpoint(
                    node.kubelet_root / "plugins" / DRIVER / "checkpoint.json", read_boot_id()
                ),
                node.cdi_dir,
                DRIVER,
                NODE,
                node.driver.preparer.devices,
            )
            await other.load()
            refused = (await other.prepare([ClaimRef(*second)]))[second[2]]
            assert refused.reason == "overlap"
            assert "gpu-4 is already prepared for ResourceClaim default/first" in refused.error

            assert await other.unprepare([ClaimRef(*first)]) == {first[2]: ""}
            answer = await node.watcher.prepare(DRIVER, [second])
            assert answer.claims[second[2]].error == ""
            assert set(node.driver.preparer.prepared) == {second[2]}

    run(body)


class _Claims:
    """Reads claims straight from the stand-in's store, as another driver's client would."""

    def __init__(self, claims: dict[tuple[str, str], Any]) -> None:
        self._claims = claims

    async def read_claim(self, namespace: str, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self._claims[(namespace, name)]
        return found
