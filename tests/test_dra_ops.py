"""Operating the DRA driver as the device plugin is operated: /healthz, /readyz, /metrics and
/status over a real TCP socket, on the real driver (simulated node, API-server stand-in, the
plugin-watcher emulator on the real unix sockets); its config file followed through
ConfigMap-style `..data` swaps and SIGHUP; and `dra serve` as a process with JSON logs."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from deviceplugin.dra.driver import DraDriver
from deviceplugin.dra.service import run_driver
from deviceplugin.model.log import FIELDS
from deviceplugin.ops.corestatus import CoreStatus
from deviceplugin.ops.drastatus import DraStatus, Pool
from deviceplugin.ops.http import DraEndpoints, EndpointServer
from deviceplugin.runtime.options import DraServeOptions
from deviceplugin.sim.apiserver import ApiServer
from deviceplugin.sim.hostroot import lay_out
from deviceplugin.sim.node import read_node, resolve_node_path
from deviceplugin.sim.pluginwatcher import PluginWatcher
from deviceplugin.sim.simulator import simulator_for
from tests.dranode import inventory
from tests.draplugin import (
    DRIVER,
    NODE,
    PRESET,
    claim,
    host_tree,
    published,
    resolve,
    run,
    short_dir,
    start_serve,
    write_kubeconfig,
)
from tests.test_http import get, sample

FOUND = inventory(PRESET)
WHOLE = next(gpu for gpu in FOUND.gpus if not gpu.mig_enabled)
WHOLE_NAME = f"gpu-{WHOLE.minor}"
OTHER_NAME = next(f"gpu-{g.minor}" for g in FOUND.gpus if not g.mig_enabled and g != WHOLE)
DEADLINE = 30.0  # generous: a loaded CI machine


def config_text(driver_root: Path, dev_root: Path | None = None) -> str:
    text = f"version: v1\nflags:\n  nvidiaDriverRoot: {driver_root}\n"
    return text + (f"  nvidiaDevRoot: {dev_root}\n" if dev_root else "")


def configmap(directory: Path, text: str) -> Path:
    """Write `config.yaml` as the kubelet updates a ConfigMap volume: the content in a new
    timestamped directory, `..data_tmp` pointed at it and renamed over `..data` in one step,
    and `config.yaml` a symlink through `..data`. The path of `config.yaml`."""
    directory.mkdir(parents=True, exist_ok=True)
    stamped = directory / f"..{time.monotonic_ns()}"
    stamped.mkdir()
    (stamped / "config.yaml").write_text(text)
    staged = directory / "..data_tmp"
    staged.symlink_to(stamped.name)
    os.replace(staged, directory / "..data")
    link = directory / "config.yaml"
    if not link.is_symlink():
        link.symlink_to("..data/config.yaml")
    return link


async def until(predicate: Callable[[], object], timeout: float = DEADLINE) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


@dataclass
class Running:
    root: Path
    server: ApiServer
    watcher: PluginWatcher
    driver: DraDriver
    http: EndpointServer
    config_dir: Path
    events: Path
    metrics_text: bytes = field(default=b"")

    @property
    def port(self) -> int:
        assert self.http.port is not None
        return self.http.port

    async def get(self, path: str) -> tuple[int, str]:
        status, _, body = await get(self.port, path)
        return status, body.decode()

    async def metric(self, name: str, **labels: str) -> float:
        status, _, body = await get(self.port, "/metrics")
        assert status == 200
        self.metrics_text = body
        return sample(body, name, **labels)

    async def wait_metric(self, name: str, at_least: float, **labels: str) -> None:
        deadline = time.monotonic() + DEADLINE
        while await self.metric(name, **labels) < at_least:
            assert time.monotonic() < deadline, f"{name}{labels} stayed below {at_least}"
            await asyncio.sleep(0.05)

    def event(self, **line: Any) -> None:
        with self.events.open("a") as file:
            file.write(json.dumps(line) + "\n")

    async def prepare(
        self, name: str, devices: list[tuple[str, str]], allocated: bool = True
    ) -> tuple[str, Any]:
        """NodePrepareResources for a new claim of `devices`: its UID and its answer."""
        stored = self.server.add_claim(claim(name, devices, allocated=allocated))["metadata"]
        ref = ("default", name, stored["uid"])
        response = await self.watcher.prepare(DRIVER, [ref])
        return stored["uid"], response.claims[stored["uid"]]


@contextlib.asynccontextmanager
async def running(
    text: str | None = None, plugin_watcher: bool = True, register: bool = True
) -> AsyncIterator[Running]:
    """The driver run as `dra serve` runs it (`run_driver`), with its HTTP endpoints on a free
    port and its config file in a ConfigMap-style directory. `plugin_watcher`: the kubelet's
    plugins_registry/ exists before the driver starts; `register`: the emulator watches it."""
    root = short_dir("draops")
    server = ApiServer()
    await server.start()
    kubelet = root / "kubelet"
    if plugin_watcher:
        (kubelet / "plugins_registry").mkdir(parents=True)
    config_dir = root / "config"
    events = root / "events.jsonl"
    events.touch()
    settings = DraServeOptions(
        config_file=str(configmap(config_dir, text or config_text(host_tree(PRESET)))),
        simulate=PRESET,
        simulate_events=str(events),
        http_address="127.0.0.1:0",
        health_recovery_after="off",
        cdi_spec_dir=root / "cdi",
        driver_name=DRIVER,
        kubelet_root=kubelet,
        kubeconfig=str(write_kubeconfig(root / "kubeconfig", server.url)),
        node_name=NODE,
    )
    driver = DraDriver(settings, simulator=simulator_for(settings.simulate))
    http = EndpointServer("127.0.0.1:0", DraEndpoints(driver))
    watcher = PluginWatcher(kubelet)
    task = asyncio.get_running_loop().create_task(run_driver(driver, http))
    try:
        await until(lambda: driver.status().core.started or task.done())
        assert not task.done(), task.exception()
        if register:
            await watcher.start()
            await watcher.wait_registered(DRIVER, DEADLINE)
        yield Running(root, server, watcher, driver, http, config_dir, events)
    finally:
        driver.engine.request_stop()
        await asyncio.wait_for(task, 15)
        await watcher.stop()
        await server.stop()
        shutil.rmtree(root, ignore_errors=True)


def spec_host_path(cdi_dir: Path, device: Any) -> str:
    """The host path of the GPU's device node in the claim's CDI device (`gpu-<minor>`)."""
    (cdi_id,) = device.cdi_device_ids
    nodes = resolve(cdi_dir, cdi_id)["deviceNodes"]
    minor = device.device_name.removeprefix("gpu-")
    (gpu_node,) = [n for n in nodes if n["path"] == f"/dev/nvidia{minor}"]
    return str(gpu_node["hostPath"])


# --- readiness --------------------------------------------------------------------------------


def test_ready_once_registered_and_published_and_not_while_the_api_server_is_gone() -> None:
    async def body() -> None:
        async with running(register=False) as node:
            assert await node.get("/healthz") == (200, "ok\n")
            status, text = await node.get("/readyz")
            assert (status, text) == (503, "not registered with the kubelet\n")

            await node.watcher.start()
            await node.watcher.wait_registered(DRIVER, DEADLINE)
            await until(lambda: node.driver.status().registered)
            assert await node.get("/readyz") == (200, "ready\n")

            await node.server.stop()  # the API server goes away; a health change must publish
            node.event(uuid=WHOLE.uuid, xid=79)
            await node.wait_metric("deviceplugin_dra_publishes_total", 1, outcome="error")
            status, text = await node.get("/readyz")
            assert status == 503 and text.startswith("API server unreachable ("), text
            _, document = await node.get("/status")
            assert json.loads(document)["unhealthy"] == {WHOLE.uuid: "xid-79"}

    run(body)


def test_without_a_plugin_watcher_serving_on_both_sockets_is_enough() -> None:
    async def body() -> None:
        async with running(plugin_watcher=False, register=False) as node:
            await until(lambda: not node.driver.status().not_ready)  # the first publish
            assert await node.get("/readyz") == (200, "ready\n")
            node.driver.dra_socket.unlink()
            assert node.driver.status().not_ready == ["not serving: a socket is missing"]
            await until(lambda: node.driver.dra_socket.exists())  # the periodic check heals it
            await until(lambda: not node.driver.status().not_ready)
            assert await node.get("/readyz") == (200, "ready\n")

    run(body)


CORE = CoreStatus(
    started=True,
    config_source=None,
    last_config_error=None,
    last_config_error_field=None,
    config_selection=None,
    nvml_available=True,
    monitoring=True,
    health_monitor_alive=True,
    unhealthy={},
)


@pytest.mark.parametrize(
    ("changes", "reasons"),
    [
        pytest.param({}, [], id="ready"),
        pytest.param(
            {"core": replace(CORE, started=False), "pool": None}, ["starting"], id="starting"
        ),
        pytest.param(
            {"core": replace(CORE, health_monitor_alive=False)},
            ["health monitor not running"],
            id="health-monitor-dead",
        ),
        pytest.param({"idle": True, "registered": False, "pool": None}, [], id="idle"),
        pytest.param({"registered": False}, ["not registered with the kubelet"], id="unregistered"),
        pytest.param({"registered": False, "plugin_watcher": False}, [], id="no-watcher"),
        pytest.param(
            {"serving": False, "pool": None},
            ["not serving: a socket is missing", "slices not published yet"],
            id="not-serving-unpublished",
        ),
        pytest.param(
            {"api_error": "API server unreachable: refused"},
            ["API server unreachable: refused"],
            id="api-gone",
        ),
        pytest.param(  # the repair after each registration still runs: not a reason
            {"slice_watch_error": "watch refused with 403"}, [], id="slice-watch-down"
        ),
    ],
)
def test_readiness_rules(changes: dict[str, Any], reasons: list[str]) -> None:
    ready = DraStatus(
        core=CORE,
        driver=DRIVER,
        node=NODE,
        idle=False,
        plugin_watcher=True,
        registered=True,
        serving=True,
        pool=Pool(generation=1, slices=1, devices=32),
        api_error=None,
        prepared_claims=0,
    )
    status = replace(ready, **changes)
    assert status.not_ready == reasons
    assert status.document()["ready"] is (not reasons)
    assert status.document()["slice_watch_error"] == status.slice_watch_error


# --- metrics ----------------------------------------------------------------------------------


def test_metrics_follow_publishes_prepares_unprepares_and_health() -> None:
    async def body() -> None:
        async with running() as node:
            stored = published(node.server)
            pool = node.driver.status().pool
            assert pool is not None
            assert await node.metric("deviceplugin_dra_devices") == len(stored)
            assert await node.metric("deviceplugin_dra_slices") == len(node.server.slices)
            assert await node.metric("deviceplugin_dra_pool_generation") == pool.generation
            assert await node.metric("deviceplugin_dra_publishes_total", outcome="ok") >= 1
            assert await node.metric("deviceplugin_dra_publish_duration_seconds_count") >= 1
            driver_version = FOUND.driver_version
            assert await node.metric("deviceplugin_build_info", driver_version=driver_version)

            uid, answer = await node.prepare("ok", [("gpu", WHOLE_NAME)])
            assert not answer.error
            _, failed = await node.prepare("unallocated", [("gpu", WHOLE_NAME)], allocated=False)
            assert failed.error
            _, taken = await node.prepare("taken", [("gpu", WHOLE_NAME)])
            assert "already prepared for ResourceClaim default/ok" in taken.error
            for reason in ("not-allocated", "overlap"):
                failures = "deviceplugin_dra_prepare_failures_total"
                assert await node.metric(failures, reason=reason) == 1
            prepare = "NodePrepareResources"
            assert await node.metric("deviceplugin_dra_claims_total", method=prepare) == 3
            assert (
                await node.metric("deviceplugin_dra_claims_total", method=prepare, outcome="ok")
                == 1
            )
            assert await node.metric("deviceplugin_dra_prepared_claims") == 1
            assert (
                await node.metric("deviceplugin_dra_rpc_duration_seconds_count", method=prepare)
                == 3
            )

            await node.watcher.unprepare(DRIVER, [("default", "ok", uid)])
            unprepare = "NodeUnprepareResources"
            assert (
                await node.metric("deviceplugin_dra_claims_total", method=unprepare, outcome="ok")
                == 1
            )
            assert await node.metric("deviceplugin_dra_prepared_claims") == 0

            published_before = await node.metric("deviceplugin_dra_publishes_total", outcome="ok")
            node.event(uuid=WHOLE.uuid, xid=79)
            await node.wait_metric("deviceplugin_health_events_total", 1, xid="79")
            await node.wait_metric(
                "deviceplugin_dra_publishes_total", published_before + 1, outcome="ok"
            )

            assert await node.metric("deviceplugin_dra_slice_repairs_total") == 0
            await until(lambda: node.server.open_watches("resourceslices") == 1)
            node.server.wipe(NODE, DRIVER)
            await node.wait_metric("deviceplugin_dra_slice_repairs_total", 1)

    run(body)


def test_a_checkpoint_gone_bad_is_set_aside_and_reported_while_claims_are_prepared() -> None:
    async def body() -> None:
        async with running() as node:
            path = node.driver.dra_socket.parent / "checkpoint.json"
            assert await node.metric("deviceplugin_dra_checkpoint_unusable_total") == 0
            path.write_bytes(b"\xff not a checkpoint")
            _, answer = await node.prepare("ok", [("gpu", WHOLE_NAME)])
            assert not answer.error
            _, document = await node.get("/status")
            status = json.loads(document)
            assert status["ready"] and status["prepared_claims"] == 1
            report = status["checkpoint"]
            assert report["unusable"] == 1 and "not UTF-8" in report["last_error"]
            assert Path(report["set_aside"]).read_bytes() == b"\xff not a checkpoint"
            assert await node.metric("deviceplugin_dra_checkpoint_unusable_total") == 1

    run(body)


def test_metric_names_follow_the_prefix_and_prometheus_conventions() -> None:
    async def body() -> None:
        async with running() as node:
            await node.metric("deviceplugin_dra_devices")
            declared = dict(
                line.split(" ")[2:4]
                for line in node.metrics_text.decode().splitlines()
                if line.startswith("# TYPE ")
            )
            dra = {name: kind for name, kind in declared.items() if "_dra_" in name}
            assert len(dra) >= 8
            assert all(name.startswith("deviceplugin_") for name in declared)
            for name, kind in dra.items():
                assert kind != "counter" or name.endswith("_total"), name
                assert kind != "histogram" or name.endswith("_seconds"), name
            # the device plugin's own families have no place here
            assert "deviceplugin_devices" not in declared

    run(body)


# --- config reload ----------------------------------------------------------------------------


def test_a_configmap_update_is_adopted_and_new_claims_get_its_roots() -> None:
    async def body() -> None:
        other = short_dir("draroot")
        lay_out(read_node(resolve_node_path(PRESET)), other)
        try:
            async with running() as node:
                cdi_dir = node.driver.settings.cdi_spec_dir
                _, first = await node.prepare("before", [("gpu", WHOLE_NAME)])
                assert spec_host_path(cdi_dir, first.devices[0]).startswith(str(host_tree(PRESET)))
                lists = node.server.requests.count(("GET", list_path()))

                configmap(node.config_dir, config_text(host_tree(PRESET), dev_root=other))
                await node.wait_metric("deviceplugin_config_reloads_total", 1, result="applied")
                _, second = await node.prepare("after", [("gpu", OTHER_NAME)])
                assert spec_host_path(cdi_dir, second.devices[0]).startswith(str(other))
                assert spec_host_path(cdi_dir, first.devices[0]).startswith(
                    str(host_tree(PRESET))
                ), "a prepared claim keeps its spec"
                await until(lambda: node.server.requests.count(("GET", list_path())) > lists)
                _, document = await node.get("/status")
                assert json.loads(document)["config"]["last_error"] is None
        finally:
            shutil.rmtree(other, ignore_errors=True)

    run(body)


def list_path() -> str:
    return "/apis/resource.k8s.io/v1/resourceslices"


def test_a_bad_config_is_refused_once_and_the_last_good_one_stays(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="deviceplugin")

    def refusals() -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.getMessage() == "config.rejected"]

    async def body() -> None:
        async with running() as node:
            cdi_dir = node.driver.settings.cdi_spec_dir
            good = config_text(host_tree(PRESET))
            configmap(node.config_dir, good + "  nvidiaDevRoot: relative/dev\n")
            await until(lambda: len(refusals()) == 1)
            (record,) = refusals()
            assert record.levelno == logging.ERROR
            fields = getattr(record, FIELDS)
            assert fields["field"] == "flags.nvidiaDevRoot", fields
            assert fields["trigger"] == "config file changed"
            assert await node.metric("deviceplugin_config_reloads_total", result="rejected") == 1
            _, document = await node.get("/status")
            config = json.loads(document)["config"]
            assert "absolute path" in config["last_error"]
            assert config["last_error_field"] == "flags.nvidiaDevRoot"
            assert await node.metric("deviceplugin_config_last_reload_successful") == 0
            assert await node.get("/readyz") == (200, "ready\n")  # still serving the last good
            _, answer = await node.prepare("meanwhile", [("gpu", WHOLE_NAME)])
            assert spec_host_path(cdi_dir, answer.devices[0]).startswith(str(host_tree(PRESET)))

            # the same bad content again is not judged (nor logged) again; SIGHUP forces it
            unchanged = await node.metric("deviceplugin_config_reloads_total", result="unchanged")
            configmap(node.config_dir, good + "  nvidiaDevRoot: relative/dev\n")
            await node.wait_metric(
                "deviceplugin_config_reloads_total", unchanged + 1, result="unchanged"
            )
            assert len(refusals()) == 1
            assert not await node.driver.reload("SIGHUP", force=True)
            assert len(refusals()) == 2

            configmap(node.config_dir, good)  # back to the content in force: nothing is wrong
            await until(lambda: node.driver.status().core.last_config_error is None)
            _, document = await node.get("/status")
            assert json.loads(document)["config"]["last_error"] is None
            assert await node.metric("deviceplugin_config_last_reload_successful") == 1
            assert len(refusals()) == 2

    run(body)


# --- the process --------------------------------------------------------------------------------


def test_dra_serve_takes_dp_http_address_logs_json_and_reloads_on_sighup() -> None:
    async def body() -> None:
        root = short_dir("draproc")
        server = ApiServer()
        await server.start()
        kubelet = root / "kubelet"
        watcher = PluginWatcher(kubelet)
        await watcher.start()
        config = configmap(root / "config", "version: v1\n")
        process = await start_serve(
            root,
            server.url,
            kubelet,
            DP_HTTP_ADDRESS="127.0.0.1:0",
            DP_LOG_FORMAT="json",
            CONFIG_FILE=str(config),
        )
        lines: list[dict[str, Any]] = []

        async def read_log() -> None:
            assert process.stderr is not None
            async for raw in process.stderr:
                lines.append(json.loads(raw))  # every line is one JSON object

        def events(name: str) -> list[dict[str, Any]]:
            return [line for line in lines if line["event"] == name]

        reader = asyncio.get_running_loop().create_task(read_log())
        try:
            await until(lambda: events("http.listening") or process.returncode is not None)
            (listening,) = events("http.listening")
            port = listening["port"]
            await watcher.wait_registered(DRIVER, DEADLINE)
            await until(lambda: events("dra.registered"))
            status, _, text = await get(port, "/readyz")
            assert (status, text) == (200, b"ready\n")
            status, _, text = await get(port, "/metrics")  # the metrics it keeps with HTTP only
            assert status == 200 and b"deviceplugin_dra_publishes_total" in text

            applied = len(events("config.applied"))
            lists = server.requests.count(("GET", list_path()))
            process.send_signal(signal.SIGHUP)
            await until(lambda: len(events("config.applied")) > applied)
            await until(lambda: server.requests.count(("GET", list_path())) > lists)
            assert process.returncode is None

            process.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(process.wait(), 15) == 0
            await asyncio.wait_for(reader, 5)
            assert events("dra.stopped")
            assert all({"ts", "level", "event", "logger"} <= line.keys() for line in lines)
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
            reader.cancel()
            await watcher.stop()
            await server.stop()
            shutil.rmtree(root, ignore_errors=True)

    run(body)
