"""dra.slicewatch with dra.publisher and dra.kubeapi, against the API-server stand-in over real
HTTP: slices someone else deletes or edits are put back at once, the publisher's own writes
cost no second list, a lost or refused watch starts again, and a watch from a compacted
resourceVersion ends with 410."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from deviceplugin.dra.kubeapi import KubeApi, connect
from deviceplugin.dra.publisher import Backoff, SlicePublisher
from deviceplugin.dra.slicewatch import SliceWatch
from deviceplugin.runtime.kubeclient import KubeError, Listed
from deviceplugin.sim.apiserver import ApiServer
from tests.dranode import inventory

NODE = "node-1"
DRIVER = "gpu.nvidia.com"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
SAFETY = 10.0  # only a broken watch waits this long; no test asserts on time
FOUND = inventory("a100-80gb-x8-mixed")  # 32 devices: one slice
QUICK = Backoff(first=0.01)


class Node:
    """The stand-in, a publisher that has published FOUND, and its watch (not yet running)."""

    def __init__(self, server: ApiServer, api: KubeApi, publisher: SlicePublisher) -> None:
        self.server, self.api, self.publisher = server, api, publisher
        self.watch = SliceWatch(api, publisher, Backoff(first=0.01, most=0.05))
        self._task: asyncio.Task[None] | None = None

    def start_watch(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.watch.run())

    async def stop_watch(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def lists(self) -> int:
        """GETs of the slices: each list, and each watch (the stand-in records paths only)."""
        return self.server.requests.count(("GET", SLICES))

    def generation(self) -> int:
        (only,) = self.server.slices.values()
        generation: int = only["spec"]["pool"]["generation"]
        return generation

    async def until(self, what: Callable[[], bool]) -> None:
        async with asyncio.timeout(SAFETY):
            while not what():
                await asyncio.sleep(0.01)

    async def watching(self) -> None:
        """Wait until a watch of the slices is open on the server."""
        await self.until(lambda: self.server.open_watches("resourceslices") == 1)

    async def pool_back(self) -> None:
        """Wait until the node's one slice is on the server again."""
        await self.until(lambda: len(self.server.slices) == 1)


Scenario = Callable[[Node], Awaitable[None]]


def run(scenario: Scenario, watching: bool = True, backoff: Backoff = QUICK) -> None:
    """`scenario(node)` once FOUND is published and, when `watching`, the watch is open."""

    async def main() -> None:
        server = ApiServer()
        await server.start()
        try:
            api = connect(server=server.url)
            publisher = SlicePublisher(api, NODE, backoff=backoff)
            node = Node(server, api, publisher)
            try:
                assert await publisher.publish(FOUND, {})
                if watching:
                    node.start_watch()
                    await node.watching()
                await scenario(node)
            finally:
                await node.stop_watch()
                await publisher.close()
        finally:
            await server.stop()

    asyncio.run(main())


async def replace(server: ApiServer, body: dict[str, Any]) -> None:
    """An edit by another client (`kubectl edit`)."""
    async with aiohttp.ClientSession() as session:
        url = f"{server.url}{SLICES}/{body['metadata']['name']}"
        async with session.put(url, data=json.dumps(body)) as answer:
            assert answer.status == 200, await answer.text()


def one_device_fewer(stored: dict[str, Any]) -> dict[str, Any]:
    edited = copy.deepcopy(stored)
    edited["spec"]["devices"] = edited["spec"]["devices"][1:]
    return edited


def test_slices_the_kubelet_wipes_are_put_back_without_a_registration() -> None:
    async def scenario(node: Node) -> None:
        node.server.wipe(NODE, DRIVER)
        await node.pool_back()
        assert node.generation() == 2
        (only,) = node.server.slices.values()
        assert len(only["spec"]["devices"]) == 32
        assert node.watch.error is None

    run(scenario)


def test_a_device_another_client_removed_is_written_back() -> None:
    async def scenario(node: Node) -> None:
        (stored,) = node.server.slices.values()
        await replace(node.server, one_device_fewer(stored))
        await node.until(
            lambda: len(next(iter(node.server.slices.values()))["spec"]["devices"]) == 32
        )
        assert node.generation() == 2

    run(scenario)


def test_the_publishers_own_writes_cost_no_second_list() -> None:
    async def scenario(node: Node) -> None:
        before = node.lists()
        gpu = FOUND.gpus[0].uuid
        assert await node.publisher.publish(FOUND, {gpu: "Xid 79"})  # a rewrite: MODIFIED
        assert node.generation() == 2
        node.server.wipe(NODE, DRIVER)  # the watch sees this after the rewrite's own event
        await node.pool_back()
        await asyncio.sleep(0.3)  # a publisher that mistook its writes would list again now
        assert node.lists() == before + 1  # to repair the wipe; none for the rewrite
        assert node.generation() == 3

    run(scenario)


def test_a_wipe_while_nobody_watched_is_found_by_the_first_list() -> None:
    async def scenario(node: Node) -> None:
        node.server.wipe(NODE, DRIVER)
        assert node.server.slices == {}
        node.start_watch()
        await node.pool_back()
        assert node.generation() == 2

    run(scenario, watching=False)


def test_a_watch_the_server_ends_is_followed_again() -> None:
    async def scenario(node: Node) -> None:
        node.server.end_watches()  # the server ends the watch
        await node.watching()
        node.server.wipe(NODE, DRIVER)
        await node.pool_back()
        assert node.generation() == 2

    run(scenario)


def test_a_refused_watch_is_retried_with_backoff_and_says_why_meanwhile() -> None:
    async def scenario(node: Node) -> None:
        node.server.fail_next(503, count=3)  # the list, then two more tries
        node.start_watch()
        await node.until(lambda: node.watch.error is not None)
        assert "503" in str(node.watch.error)
        await node.until(lambda: node.watch.error is None)
        await node.watching()
        node.server.wipe(NODE, DRIVER)
        await node.pool_back()

    run(scenario, watching=False)


class Surprising:
    """The real API whose first list raises what no one expects."""

    def __init__(self, api: KubeApi) -> None:
        self.api = api
        self.lists = 0

    async def list_slices(self, node: str, driver: str) -> Listed:
        self.lists += 1
        if self.lists == 1:
            raise RuntimeError("a bug")
        return await self.api.list_slices(node, driver)

    def watch_slices(
        self, node: str, driver: str, since: str
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        return self.api.watch_slices(node, driver, since)


def test_an_unexpected_error_does_not_end_the_watch() -> None:
    async def scenario(node: Node) -> None:
        node.watch = SliceWatch(Surprising(node.api), node.publisher, QUICK)
        node.start_watch()
        await node.watching()
        assert node.watch.error is None  # "a bug" was logged, then a fresh list worked
        node.server.wipe(NODE, DRIVER)
        await node.pool_back()

    run(scenario, watching=False)


def test_a_watch_from_a_compacted_version_ends_with_410() -> None:
    async def scenario(node: Node) -> None:
        listed = await node.api.list_slices(NODE, DRIVER)
        node.server.compact()
        with pytest.raises(KubeError, match="too old") as raised:
            async for _ in node.api.watch_slices(NODE, DRIVER, listed.version):
                pass
        assert raised.value.status == 410

    run(scenario, watching=False)


def test_a_watch_yields_the_changes_after_the_listed_version() -> None:
    async def scenario(node: Node) -> None:
        listed = await node.api.list_slices(NODE, DRIVER)
        node.server.wipe(NODE, DRIVER)  # before the watch: it starts from the listed version

        names = [item["metadata"]["name"] for item in listed.items]

        async def changes() -> list[tuple[str, str]]:
            seen = []
            async for kind, item in node.api.watch_slices(NODE, DRIVER, listed.version):
                seen.append((kind, item["metadata"]["name"]))
                if len(seen) == len(names):
                    return seen
            return seen

        assert await asyncio.wait_for(changes(), 10) == [("DELETED", name) for name in names]

    run(scenario, watching=False)


async def rival(server: ApiServer, seconds: float) -> None:
    """Another writer that wants one device fewer in the slice, and says so whenever the slice
    has them all again, for `seconds`."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            while True:
                (stored,) = server.slices.values()
                if len(stored["spec"]["devices"]) == 32:
                    await replace(server, one_device_fewer(stored))
                await asyncio.sleep(0.005)


def test_two_writers_with_other_content_do_not_fight_at_full_speed() -> None:
    async def scenario(node: Node) -> None:
        await rival(node.server, seconds=2.0)
        # Repairs wait 0, 0.1, 0.2, 0.4, 0.8 s...: at most 6 in 2 s (the rival needs about
        # 10 ms a round, so at full speed it would be a hundred), and none given up.
        repairs = node.generation() - 1
        assert 2 <= repairs <= 6

    run(scenario, backoff=Backoff(first=0.1, most=1.0))


def streamed(data: bytes, count: int = 2) -> list[tuple[str, dict[str, Any]]]:
    """The first `count` changes `watch_slices` yields from a server that answers the watch
    with `data`, sent in chunks as a network delivers it."""

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        for start in range(0, len(data), 16_384):
            await response.write(data[start : start + 16_384])
        await response.write_eof()
        return response

    async def body() -> list[tuple[str, dict[str, Any]]]:
        app = web.Application()
        app.router.add_get(SLICES, stream)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        api = connect(server=f"http://127.0.0.1:{runner.addresses[0][1]}")
        try:
            changes = []
            async for change in api.watch_slices(NODE, DRIVER, "1"):
                changes.append(change)
                if len(changes) == count:
                    break
            return changes
        finally:
            await api.close()
            await runner.cleanup()

    return asyncio.run(body())


def event(kind: str, name: str, padding: int = 0) -> bytes:
    meta = {"name": name, "resourceVersion": "9", "annotations": {"pad": "x" * padding}}
    return json.dumps({"type": kind, "object": {"metadata": meta}}).encode() + b"\n"


def test_a_watch_event_longer_than_a_readline_arrives_whole() -> None:
    """One event holds a whole slice: 128 devices and the server's managedFields come to a few
    hundred KiB, and etcd takes objects up to 1.5 MiB: the client's line reader must take it
    whole, however the stream cuts it."""
    changes = streamed(event("MODIFIED", "big", 1_200_000) + event("DELETED", "small", 10))
    assert [
        (kind, item["metadata"]["name"], len(item["metadata"]["annotations"]["pad"]))
        for kind, item in changes
    ] == [("MODIFIED", "big", 1_200_000), ("DELETED", "small", 10)]


@pytest.mark.parametrize("garbled", [b"[1, 2]\n", b"{not json\n"])
def test_a_garbled_watch_stream_is_a_lost_watch(garbled: bytes) -> None:
    with pytest.raises(KubeError, match="watch of ResourceSlice: the answer is not"):
        streamed(event("MODIFIED", "first") + garbled + event("DELETED", "never"))
