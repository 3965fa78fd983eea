"""`inspect` end to end: dry runs on the simulator presets, `--pods` against the pod-resources
emulator over a real unix socket (or without one), and `--from` against a plugin serving HTTP
in-process."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deviceplugin.kubelet.pods import pod_resources_socket, read_pods
from deviceplugin.model.errors import ConfigError
from deviceplugin.ops.http import HttpServer
from deviceplugin.ops.metrics import Metrics
from deviceplugin.plugin.inspect import inspect
from deviceplugin.plugin.service import run_supervisor
from deviceplugin.plugin.supervisor import Supervisor
from deviceplugin.runtime.options import InspectOptions, ServeOptions
from deviceplugin.sim.kubelet import KubeletEmulator
from deviceplugin.sim.podresources import PodResourcesEmulator
from deviceplugin.sim.simulator import simulator_for

GPU = "nvidia.com/gpu"
TIME_SLICING = """\
version: v1
sharing:
  timeSlicing:
    resources:
      - name: nvidia.com/gpu
        replicas: 4
"""


@pytest.fixture
def root() -> Iterator[Path]:
    """A short directory for AF_UNIX sockets (pytest's tmp_path can be too long)."""
    path = Path(tempfile.mkdtemp(prefix="dp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def settings_for(root: Path, **fields: Any) -> InspectOptions:
    return InspectOptions(kubelet_dir=root / "device-plugins", env={}, **fields)


def run_json(settings: InspectOptions, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert inspect(settings) == 0
    document: dict[str, Any] = json.loads(capsys.readouterr().out)
    return document


@pytest.mark.parametrize(
    ("preset", "strategy", "expected"),
    [
        pytest.param(
            "a100-80gb-x8-mixed", "mixed", {GPU: 4, "nvidia.com/mig-1g.10gb": 28}, id="a100-mixed"
        ),
        pytest.param("a100-80gb-x8-mixed", None, {GPU: 8}, id="a100-strategy-none"),
        pytest.param("a30-x4-mig", "mixed", {"nvidia.com/mig-1g.6gb": 16}, id="a30-mig"),
        pytest.param("a10-x8", None, {GPU: 8}, id="a10-pcie"),
        pytest.param("h100-x8", None, {GPU: 8}, id="h100"),
    ],
)
def test_json_dry_run_on_presets(
    root: Path,
    capsys: pytest.CaptureFixture[str],
    preset: str,
    strategy: str | None,
    expected: dict[str, int],
) -> None:
    settings = settings_for(
        root, simulate=preset, output="json", overrides={"mig_strategy": strategy}
    )
    document = run_json(settings, capsys)
    assert document["live"] is False and document["ready"] is None
    assert document["config"]["source"] == "defaults"
    assert document["config"]["active"]["flags"]["migStrategy"] == (strategy or "none")
    resources = {r["name"]: r for r in document["resources"]}
    assert {name: r["total"] for name, r in resources.items()} == expected
    for resource in resources.values():
        assert resource["healthy"] == resource["total"] == len(resource["devices"])
        assert resource["registered"] is None and resource["replicas"] == 1
        for device in resource["devices"]:
            assert device["health"] == "Healthy" and "pods" not in device
            if device["mig_profile"] is None:
                assert device["id"] == device["physical_uuid"] == device["gpu_uuid"]
            else:
                assert device["id"] == device["physical_uuid"] != device["gpu_uuid"]
                assert device["id"].startswith("MIG-") and device["gpu_uuid"].startswith("GPU-")
                assert resource["name"] == f"nvidia.com/mig-{device['mig_profile']}"
    if preset == "a10-x8":
        assert {d["numa_node"] for d in resources[GPU]["devices"]} == {0, 1}


def test_json_shows_replicas_and_the_config_source(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = root / "config.yaml"
    config.write_text(TIME_SLICING)
    document = run_json(
        settings_for(root, simulate="a10-x8", config_file=str(config), output="json"), capsys
    )
    assert document["config"]["source"] == str(config)
    assert document["config"]["active"]["sharing"]["timeSlicing"]["resources"][0]["replicas"] == 4
    (resource,) = document["resources"]
    assert resource["replicas"] == 4 and resource["total"] == 32
    for device in resource["devices"]:
        physical, _, replica = device["id"].partition("::")
        assert device["physical_uuid"] == device["gpu_uuid"] == physical
        assert device["replica"] == int(replica) and device["replicas"] == 4


def test_table(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings = settings_for(
        root, simulate="a100-80gb-x8-mixed", overrides={"mig_strategy": "mixed"}
    )
    assert inspect(settings) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["RESOURCE", "DEVICES", "HEALTHY", "REPLICAS", "SOCKET"]
    assert lines[1].split() == [GPU, "4", "4", "1", "nvidia-gpu.sock"]
    assert lines[2].split() == [
        "nvidia.com/mig-1g.10gb",
        "28",
        "28",
        "1",
        "nvidia-mig-1g.10gb.sock",
    ]
    assert "config: defaults" in lines


def test_invalid_config_is_a_config_error(root: Path) -> None:
    config = root / "config.yaml"
    config.write_text(TIME_SLICING.replace("replicas: 4", "replicas: 1"))
    with pytest.raises(ConfigError, match="replicas"):
        inspect(settings_for(root, simulate="a10-x8", config_file=str(config)))


def test_pods_without_a_socket_is_a_note(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert inspect(settings_for(root, simulate="h100-x8", pods=True)) == 0
    out = capsys.readouterr().out
    path = pod_resources_socket(root / "device-plugins")
    assert f"note: pod-resources socket {path} not found: pod assignments unknown" in out
    document = run_json(settings_for(root, simulate="h100-x8", pods=True, output="json"), capsys)
    assert document["pods"]["known"] is False
    assert all("pods" not in d for r in document["resources"] for d in r["devices"])


def test_pods_from_the_kubelet(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    async def scenario() -> None:
        emulator = PodResourcesEmulator(root)
        await emulator.start()
        try:
            as_json = settings_for(root, simulate="a10-x8", pods=True, output="json")
            assert await asyncio.to_thread(inspect, as_json) == 0
            document = json.loads(capsys.readouterr().out)
            assert document["pods"]["known"] is True
            devices = [d for r in document["resources"] for d in r["devices"]]
            assert all(d["pods"] == [] for d in devices)
            assert "no device is held by a pod" in await table(root, capsys)

            device = devices[5]["id"]
            emulator.assign("ml", "trainer-0", "main", GPU, [device])
            lines = (await table(root, capsys)).splitlines()
            assert lines[lines.index("") + 1].split() == [
                "DEVICE",
                "RESOURCE",
                "POD",
                "CONTAINER",
                "GPU",
            ]
            assert [device, GPU, "ml/trainer-0", "main", device] in [ln.split() for ln in lines]
        finally:
            await emulator.stop()

    asyncio.run(scenario())


async def table(root: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert await asyncio.to_thread(inspect, settings_for(root, simulate="a10-x8", pods=True)) == 0
    return capsys.readouterr().out


def test_from_a_live_plugin(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    async def scenario() -> None:
        kubelet_dir = root / "device-plugins"
        kubelet, pods = KubeletEmulator(kubelet_dir), PodResourcesEmulator(root)
        await kubelet.start()
        await pods.start()
        events = root / "events.jsonl"
        events.touch()
        settings = ServeOptions(
            kubelet_dir=kubelet_dir,
            cdi_spec_dir=kubelet_dir.parent / "cdi",
            simulate="a10-x8",
            simulate_events=str(events),
            health_recovery_after="off",
            env={},
        )
        supervisor = Supervisor(settings, Metrics(), simulator_for(settings.simulate))
        http = HttpServer(
            "127.0.0.1:0", supervisor, pod_resources_socket(kubelet_dir), read_pods=read_pods
        )
        task = asyncio.get_running_loop().create_task(run_supervisor(supervisor, http))
        try:
            deadline = time.monotonic() + 5
            while not (supervisor.status().ready and kubelet.allocatable(GPU) == 8):
                assert not task.done() and time.monotonic() < deadline
                await asyncio.sleep(0.02)
            device, sick = sorted(kubelet.devices(GPU))[3:5]
            pods.assign("ml", "infer", "server", GPU, [device])
            events.write_text(json.dumps({"uuid": sick, "xid": 79}) + "\n")
            await kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 7)
            source = f"http://127.0.0.1:{http.port}"
            live = settings_for(root, source=source, pods=True)
            assert await asyncio.to_thread(inspect, live) == 0
            out = capsys.readouterr().out
            assert out.splitlines()[0].split()[-1] == "REGISTERED"
            assert out.splitlines()[1].split() == [GPU, "8", "7", "1", "nvidia-gpu.sock", "yes"]
            assert "ready: yes" in out
            assert any(ln.startswith(f"unhealthy: {sick} ({GPU}): ") for ln in out.splitlines())
            assert [device, GPU, "ml/infer", "server", device] in [
                ln.split() for ln in out.splitlines()
            ]
            plain = settings_for(root, source=f"127.0.0.1:{http.port}", output="json")
            assert await asyncio.to_thread(inspect, plain) == 0
        finally:
            supervisor.engine.request_stop()
            await asyncio.wait_for(task, 10)
            await pods.stop()
            await kubelet.stop()

    asyncio.run(scenario())
    document = json.loads(capsys.readouterr().out)
    assert document["live"] is True and document["ready"] is True
    assert document["resources"][0]["registered"] is True
    assert "pods" not in document  # not asked for


def test_from_an_unreachable_address(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as bound:  # bound, never listening: refused, and no one else's port
        bound.bind(("127.0.0.1", 0))
        port = bound.getsockname()[1]
        assert inspect(settings_for(root, source=f"http://127.0.0.1:{port}")) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert f"cannot read http://127.0.0.1:{port}/status" in captured.err
