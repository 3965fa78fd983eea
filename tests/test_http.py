"""The HTTP endpoints over a real TCP socket, on a plugin running in-process on the simulator
against the kubelet and pod-resources emulators (real gRPC over unix sockets): counters move with
Allocate, health events, reloads and kubelet restarts; /readyz follows registration; the pod
gauge follows the kubelet's assignments; garbage never takes the server down."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

import deviceplugin.ops.http
import deviceplugin.runtime.engine
from deviceplugin.demos.plugin import SEED_CONFIG
from deviceplugin.kubelet.pods import pod_resources_socket, read_pods
from deviceplugin.model.errors import ConfigError
from deviceplugin.ops.http import MAX_HEAD, HttpServer, parse_address
from deviceplugin.ops.metrics import Metrics
from deviceplugin.plugin.service import run_supervisor
from deviceplugin.plugin.supervisor import Supervisor
from deviceplugin.runtime.options import ServeOptions
from deviceplugin.sim.kubelet import KubeletEmulator
from deviceplugin.sim.podresources import PodResourcesEmulator
from deviceplugin.sim.simulator import simulator_for

PRESET = "a100-80gb-x8-mixed"
CONFIG = SEED_CONFIG
GPU, MIG = "nvidia.com/gpu", "nvidia.com/mig-1g.10gb"
EVENT = re.compile(r"[a-z]+(\.[a-z-]+)+")
WAIT = 60.0  # a deadline for conditions, generous for a loaded machine; met at once normally


async def request(port: int, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send raw bytes on a fresh connection; read the answer until the server closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split(" ")[1]), headers, body


async def get(port: int, path: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    return await request(port, f"{method} {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode())


def sample(text: bytes, name: str, **labels: str) -> float:
    """Sum of the samples called `name` whose labels include `labels`."""
    total = 0.0
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


async def until(predicate: Callable[[], bool], timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


@dataclass
class Plugin:
    root: Path
    kubelet: KubeletEmulator
    pods: PodResourcesEmulator
    supervisor: Supervisor
    http: HttpServer
    config: Path
    events: Path

    @property
    def port(self) -> int:
        assert self.http.port is not None
        return self.http.port

    async def metrics(self) -> bytes:
        status, headers, body = await get(self.port, "/metrics")
        assert status == 200
        assert headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        return body

    async def scrape_until(self, predicate: Callable[[bytes], bool]) -> bytes:
        deadline = time.monotonic() + WAIT
        while not predicate(body := await self.metrics()):
            assert time.monotonic() < deadline, "metric not reached in time"
            await asyncio.sleep(0.05)
        return body

    async def advertised(self) -> None:
        """Wait until the kubelet has every device of the preset from ListAndWatch."""
        kubelet = self.kubelet
        await until(lambda: kubelet.allocatable(GPU) == 8 and kubelet.allocatable(MIG) == 28)

    async def readyz(self) -> tuple[int, str]:
        status, _, body = await get(self.port, "/readyz")
        return status, body.decode()


@contextlib.asynccontextmanager
async def running_plugin(config_dir: str = "") -> AsyncIterator[Plugin]:
    """serve with --http-address 127.0.0.1:0 on the preset, registered with the emulators; the
    config file is in the `config_dir` directory of the plugin's root."""
    root = Path(tempfile.mkdtemp(prefix="dp"))
    kubelet_dir = root / "device-plugins"
    kubelet, pods = KubeletEmulator(kubelet_dir), PodResourcesEmulator(root)
    await kubelet.start()
    await pods.start()
    config, events = root / config_dir / "config.yaml", root / "events.jsonl"
    config.parent.mkdir(exist_ok=True)
    config.write_text(CONFIG.format(replicas=2))
    events.touch()
    settings = ServeOptions(
        kubelet_dir=kubelet_dir,
        cdi_spec_dir=root / "cdi",
        simulate=PRESET,
        simulate_events=str(events),
        config_file=str(config),
        http_address="127.0.0.1:0",
        health_recovery_after="off",
        env={},
    )
    supervisor = Supervisor(settings, Metrics(), simulator_for(settings.simulate))
    http = HttpServer(
        "127.0.0.1:0", supervisor, pod_resources_socket(kubelet_dir), read_pods=read_pods
    )
    task = asyncio.get_running_loop().create_task(run_supervisor(supervisor, http))
    try:
        await until(lambda: http.port is not None or task.done())
        yield Plugin(root, kubelet, pods, supervisor, http, config, events)
    finally:
        supervisor.engine.request_stop()
        await asyncio.wait_for(task, 10)
        await pods.stop()
        await kubelet.stop()
        shutil.rmtree(root, ignore_errors=True)


def replace_config(path: Path, text: str) -> None:
    """Swap the file in one rename, as an editor or a ConfigMap update does."""
    staged = path.with_suffix(".new")
    staged.write_text(text)
    os.replace(staged, path)


def test_counters_move_with_allocate_health_and_reload(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="deviceplugin")

    async def scenario() -> None:
        async with running_plugin() as plugin:
            kubelet = plugin.kubelet
            await plugin.advertised()
            before = await plugin.metrics()
            assert sample(before, "deviceplugin_devices", resource=MIG, health="Healthy") == 28
            assert sample(before, "deviceplugin_devices", resource=GPU, health="Healthy") == 8
            assert sample(before, "deviceplugin_registrations_total", kind="first") == 2
            assert sample(before, "deviceplugin_build_info", driver_version="550.90.07") == 1

            replica = sorted(kubelet.devices(GPU))[0]
            await kubelet.allocate(GPU, [[replica]])
            await kubelet.preferred(MIG, sorted(kubelet.devices(MIG)), [], 2)
            after = await plugin.metrics()
            calls = "deviceplugin_rpc_requests_total"
            for resource, method in ((GPU, "Allocate"), (MIG, "GetPreferredAllocation")):
                labels = {"resource": resource, "method": method}
                assert sample(after, calls, outcome="ok", **labels) == 1 + sample(
                    before, calls, outcome="ok", **labels
                )
                assert sample(after, "deviceplugin_rpc_duration_seconds_count", **labels) == 1
            with pytest.raises(grpc.aio.AioRpcError) as refusal:
                await kubelet.allocate(GPU, [["GPU-not-here::0"]])
            assert refusal.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            refused = await plugin.metrics()
            assert sample(refused, calls, resource=GPU, method="Allocate", outcome="error") == 1

            physical = replica.split("::")[0]
            with plugin.events.open("a") as file:
                file.write(json.dumps({"uuid": physical, "xid": 79}) + "\n")
            assert await kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 6, WAIT)
            health = "deviceplugin_health_events_total"
            sick = await plugin.scrape_until(lambda body: sample(body, health, xid="79") == 1)
            assert sample(sick, "deviceplugin_devices", resource=GPU, health="Unhealthy") == 2

            applied = "deviceplugin_config_reloads_total"
            replace_config(plugin.config, CONFIG.format(replicas=4))
            assert await kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == 16, WAIT)
            reloaded = await plugin.metrics()
            assert sample(reloaded, applied, result="applied") == 1
            assert sample(reloaded, "deviceplugin_config_last_reload_successful") == 1
            assert sample(reloaded, "deviceplugin_devices", resource=GPU) == 16

            replace_config(plugin.config, CONFIG.format(replicas=1))  # replicas < 2: invalid
            await until(lambda: plugin.supervisor.status().core.last_config_error is not None)
            rejected = await plugin.metrics()
            assert sample(rejected, applied, result="rejected") == 1  # judged once per content
            assert sample(rejected, "deviceplugin_devices", resource=GPU) == 16
            assert sample(rejected, "deviceplugin_config_last_reload_successful") == 0
            status = json.loads((await get(plugin.port, "/status"))[2])
            assert "replicas" in status["config"]["last_error"]
            field = status["config"]["last_error_field"]
            assert field == "sharing.timeSlicing.resources[0].replicas"

    asyncio.run(scenario())
    ours = [r for r in caplog.records if r.name.startswith("deviceplugin")]
    assert all(EVENT.fullmatch(r.getMessage()) for r in ours), "every line is an event name"
    applied = [r for r in ours if r.getMessage() == "config.applied"]
    assert len(applied) == 2  # the effective config, at start and after the one valid reload
    assert all('"replicas":' in json.dumps(r.dp_fields["config"]) for r in applied)


def test_readyz_follows_registration_and_kubelet_restarts() -> None:
    async def scenario() -> None:
        async with running_plugin() as plugin:
            assert (await get(plugin.port, "/healthz"))[:1] == (200,)
            await until(lambda: plugin.supervisor.status().ready)
            assert await plugin.readyz() == (200, "ready\n")

            await plugin.kubelet.stop()  # the kubelet is down: registration cannot finish
            await plugin.supervisor.kubelet_restarted("test")
            status, text = await plugin.readyz()
            assert status == 503
            assert f"not registered: {GPU}, {MIG}" in text
            assert "kubelet restart in progress" in text
            assert (await get(plugin.port, "/healthz"))[2] == b"ok\n"
            failures = "deviceplugin_registration_failures_total"
            down = await plugin.scrape_until(lambda body: sample(body, failures, resource=GPU) > 0)
            assert sample(down, "deviceplugin_kubelet_restarts_total") == 1

            await plugin.kubelet.start()
            await until(lambda: plugin.supervisor.status().ready, timeout=10)
            assert (await plugin.readyz())[0] == 200
            again = await plugin.metrics()
            assert sample(again, "deviceplugin_registrations_total", kind="again") >= 2
            document = json.loads((await get(plugin.port, "/status"))[2])
            assert document["ready"] is True
            assert all(resource["registered"] for resource in document["resources"])

    asyncio.run(scenario())


def test_pod_gauge_follows_the_kubelet_assignments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deviceplugin.ops.http, "POD_REFRESH_SECONDS", 0.3)
    # the periodic check lists pods too (what DRA claims hold): only the scrapes' calls here
    monkeypatch.setattr(deviceplugin.runtime.engine, "SOCKET_CHECK_SECONDS", 3600.0)

    async def scenario() -> None:
        async with running_plugin() as plugin:
            kubelet = plugin.kubelet
            await plugin.advertised()
            replica = sorted(kubelet.devices(GPU))[0]
            mig = sorted(kubelet.devices(MIG))[0]
            plugin.pods.assign("ml", "trainer-0", "main", GPU, [replica])
            plugin.pods.assign("ml", "notebook", "lab", MIG, [mig])
            plugin.pods.assign("ml", "notebook", "lab", "example.com/fpga", ["fpga0"])
            body = await plugin.metrics()
            name = "deviceplugin_allocated_device"
            physical = replica.split("::")[0]
            assert (
                sample(
                    body,
                    name,
                    resource=GPU,
                    device=replica,
                    physical=physical,
                    gpu=physical,
                    namespace="ml",
                    pod="trainer-0",
                    container="main",
                )
                == 1
            )
            parent = plugin.supervisor.status().resources[MIG].by_id()[mig].gpu_uuid
            assert sample(body, name, device=mig, physical=mig, gpu=parent, pod="notebook") == 1
            assert sample(body, name) == 2  # another vendor's device is not ours to report

            calls = plugin.pods.calls
            await asyncio.gather(*(plugin.metrics() for _ in range(5)))
            assert plugin.pods.calls == calls  # asked at most once per refresh period
            plugin.pods.release("ml", "trainer-0")
            await plugin.scrape_until(lambda body: sample(body, name) == 1)

            status = json.loads((await get(plugin.port, "/status"))[2])
            assert status["pods"]["known"] is True
            holders = {d["id"]: d["pods"] for r in status["resources"] for d in r["devices"]}
            assert holders[mig] == [{"namespace": "ml", "pod": "notebook", "container": "lab"}]
            assert holders[replica] == []

            await plugin.pods.stop()
            await plugin.scrape_until(lambda body: sample(body, name) == 0)
            status = json.loads((await get(plugin.port, "/status"))[2])
            assert status["pods"]["known"] is False
            assert "not found: pod assignments unknown" in status["pods"]["note"]

    asyncio.run(scenario())


def test_answers_before_start_and_survives_garbage() -> None:
    async def scenario() -> None:
        root = Path(tempfile.mkdtemp(prefix="dp"))
        settings = ServeOptions(
            kubelet_dir=root / "device-plugins", cdi_spec_dir=root / "cdi", env={}
        )
        http = HttpServer(
            "127.0.0.1:0", Supervisor(settings), root / "absent.sock", read_pods=read_pods
        )
        await http.start()
        try:
            assert http.port is not None
            port = http.port
            status, headers, body = await get(port, "/healthz")
            assert (status, body) == (200, b"ok\n")
            assert headers["Content-Type"] == "text/plain; charset=utf-8"
            status, _, body = await get(port, "/readyz")
            assert (status, body) == (503, b"starting\n")
            head = await get(port, "/healthz", method="HEAD")
            assert head[0] == 200 and head[2] == b"" and head[1]["Content-Length"] == "3"
            assert (await get(port, "/nope"))[0] == 404
            assert (await get(port, "/healthz?verbose=1"))[0] == 200
            assert (await get(port, "/metrics", method="POST"))[0] == 405
            assert (await request(port, b"\x00\xff garbage\r\n\r\n"))[0] == 400
            assert (await request(port, b"GET /\xff HTTP/1.1\r\n\r\n"))[0] == 400
            huge = b"GET /healthz HTTP/1.1\r\nX: " + b"a" * (2 * MAX_HEAD) + b"\r\n\r\n"
            assert (await request(port, huge))[0] == 431
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /hea")  # and hang up mid-request
            writer.close()
            assert (await get(port, "/healthz"))[0] == 200
        finally:
            await http.stop()
            shutil.rmtree(root, ignore_errors=True)
        assert http.port is None

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        pytest.param("127.0.0.1:8080", ("127.0.0.1", 8080), id="ipv4"),
        pytest.param(":9400", (None, 9400), id="every-interface"),
        pytest.param("[::1]:0", ("::1", 0), id="ipv6"),
        pytest.param("localhost:65535", ("localhost", 65535), id="name"),
    ],
)
def test_parse_address(address: str, expected: tuple[str | None, int]) -> None:
    assert parse_address(address) == expected


@pytest.mark.parametrize("address", ["8080", "host:", "host:port", "host:70000", ""])
def test_parse_address_rejects(address: str) -> None:
    with pytest.raises(ConfigError, match="--http-address"):
        parse_address(address)
