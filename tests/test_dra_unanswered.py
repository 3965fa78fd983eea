"""The DRA driver in front of an API server that accepts connections and never answers
(overload, a half-open network path): the kubelet side comes first and never waits on it. The
DRA socket is served and served again when deleted, a health change and a reload are taken,
SIGTERM ends `dra serve` at once, and once the server answers again the slices are published.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from pathlib import Path

import pytest

from deviceplugin.dra.driver import DraDriver
from deviceplugin.dra.service import run_driver
from deviceplugin.runtime import kubeclient
from deviceplugin.runtime.options import DraServeOptions
from deviceplugin.sim.apiserver import ApiServer
from deviceplugin.sim.pluginwatcher import PluginWatcher
from deviceplugin.sim.simulator import simulator_for
from tests.draplugin import (
    DRIVER,
    NODE,
    PRESET,
    host_tree,
    published,
    short_dir,
    start_serve,
    write_kubeconfig,
)

SIGTERM_SECONDS = 10.0


class HoldingFront:
    """A TCP front of the stand-in: while `holding`, each connection is accepted and never
    answered; once released, new connections reach the stand-in (held ones stay held)."""

    def __init__(self, upstream: str) -> None:
        self.holding = True
        self.held = 0
        self._port = int(upstream.rsplit(":", 1)[1])
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in self._tasks:
            task.cancel()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.holding:
            self.held += 1
            await reader.read()  # until the client gives up and closes
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._port)
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.get_running_loop().create_task(_pipe(source, sink))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await source.read(65536):
            sink.write(data)
            await sink.drain()
    sink.close()


async def until(predicate: object, timeout: float = 10.0) -> None:
    began = time.monotonic()
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() - began < timeout, "condition not met in time"
        await asyncio.sleep(0.02)


def test_the_kubelet_side_works_while_the_api_server_never_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kubeclient, "CALL_SECONDS", 1.0)

    async def body() -> None:
        root = short_dir("drahang")
        server = ApiServer()
        await server.start()
        front = HoldingFront(server.url)
        url = await front.start()
        events = root / "events.jsonl"
        events.touch()
        config = root / "config.yaml"
        tree = host_tree(PRESET)
        config.write_text(f"version: v1\nflags:\n  nvidiaDriverRoot: {tree}\n")
        settings = DraServeOptions(
            config_file=str(config),
            simulate=PRESET,
            simulate_events=str(events),
            health_recovery_after="off",
            cdi_spec_dir=root / "cdi",
            driver_name=DRIVER,
            kubelet_root=root / "kubelet",
            kubeconfig=str(write_kubeconfig(root / "kubeconfig", url)),
            node_name=NODE,
        )
        (settings.kubelet_root / "plugins_registry").mkdir(parents=True)
        watcher = PluginWatcher(settings.kubelet_root)
        await watcher.start()
        driver = DraDriver(settings, simulator=simulator_for(settings.simulate))
        task = asyncio.get_running_loop().create_task(run_driver(driver))
        try:
            await watcher.wait_registered(DRIVER, 30)
            assert driver.status().serving and front.held > 0
            assert published(server) == {}

            driver.dra_socket.unlink()  # the kubelet cleaned its directory
            await asyncio.wait_for(driver.heal_sockets(), 5)
            assert driver.status().serving

            assert driver.preparer is not None
            name, (gpu, _) = next(iter(driver.preparer.devices.by_name.items()))
            uuid = gpu.uuid
            with events.open("a") as file:
                file.write(json.dumps({"uuid": uuid, "xid": 79}) + "\n")
            await until(lambda: uuid in driver.engine.unhealthy)

            config.write_text(config.read_text() + "sharing: {}\n")
            assert await asyncio.wait_for(driver.reload("test", force=True), 5)
            assert driver.status().core.last_config_error is None

            front.holding = False  # the server answers new requests from now on
            await until(lambda: len(published(server)) == 32, 30)
            taints = published(server)[name].get("taints")
            assert taints, "the Xid taken while the server hung is published"
        finally:
            driver.engine.request_stop()
            await asyncio.wait_for(task, SIGTERM_SECONDS)
            await watcher.stop()
            await front.stop()
            await server.stop()

    asyncio.run(body())


def test_dra_serve_answers_and_stops_on_sigterm_while_every_call_hangs(tmp_path: Path) -> None:
    async def body() -> None:
        root = short_dir("drahang")
        server = ApiServer()
        await server.start()
        front = HoldingFront(server.url)
        url = await front.start()
        kubelet = root / "kubelet"
        (kubelet / "plugins_registry").mkdir(parents=True)
        watcher = PluginWatcher(kubelet)
        await watcher.start()
        process = await start_serve(root, url, kubelet, "--http-address", "127.0.0.1:0")
        try:
            await watcher.wait_registered(DRIVER, 30)
            assert front.held > 0
            began = time.monotonic()
            process.send_signal(signal.SIGTERM)
            code = await asyncio.wait_for(process.wait(), SIGTERM_SECONDS + 2)
            assert code == 0 and time.monotonic() - began < SIGTERM_SECONDS
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
            await watcher.stop()
            await front.stop()
            await server.stop()

    asyncio.run(body())
