"""`serve` on a node a DRA driver handed GPUs out on: the real plugin on the simulated node,
against the kubelet and PodResources emulators over real unix sockets. Every ID whose GPU or
MIG device a prepared claim holds is Unhealthy at the kubelet, with the claim and pod as the
reason Allocate gives, until the kubelet no longer reports the claim; NVML health and the hold
never overwrite each other; a PodResources socket that stops answering releases nothing."""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from harness import GPU, MIG, Plugin, run, running_plugin
from prometheus_client.parser import text_string_to_metric_families

from deviceplugin.model.devices import Device, Health
from deviceplugin.model.resources import ResourceSet
from deviceplugin.ops.snapshot import build_snapshot
from deviceplugin.plugin.draholds import withhold
from deviceplugin.runtime import engine
from deviceplugin.sim.podresources import PodResourcesEmulator

DRIVER = "gpu.nvidia.com"
WHOLE = 4  # a whole GPU of a100-80gb-x8-mixed (index and minor 4)
SLICED = 0  # a GPU in MIG mode there
HELD_GAUGE = "deviceplugin_devices_held_by_dra"
HOLD = "held by claim ml/gpus: gpu.nvidia.com/gpu-4 (pod ml/trainer) through DRA"


@pytest.fixture(autouse=True)
def quick_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The periodic checks, PodResources' List among them, every 50 ms instead of 5 s."""
    monkeypatch.setattr(engine, "SOCKET_CHECK_SECONDS", 0.05)


def claim_whole_gpu(pods: PodResourcesEmulator) -> None:
    pods.assign_claim("ml", "trainer", "main", "ml", "gpus", DRIVER, "node-a", f"gpu-{WHOLE}")


def gpu_uuid(plugin: Plugin, index: int) -> str:
    inventory = plugin.supervisor.inventory
    assert inventory is not None
    return inventory.gpus[index].uuid


def ids_on(plugin: Plugin, resource: str, gpu: str) -> list[str]:
    devices = plugin.supervisor.resources[resource].devices
    return sorted(device.id for device in devices if device.gpu_uuid == gpu)


def unhealthy_at_kubelet(plugin: Plugin, resource: str) -> list[str]:
    return sorted(i for i, d in plugin.kubelet.devices(resource).items() if not d.healthy)


def advertised(plugin: Plugin, resource: str, device_id: str) -> Device:
    """The device as the plugin serves it now."""
    return plugin.supervisor.resources[resource].by_id()[device_id]


def holds(plugin: Plugin) -> dict[str, Any]:
    document = plugin.supervisor.status().dra_holds
    assert document is not None
    return dict(document)


def held_gauge(plugin: Plugin, resource: str) -> float:
    text = plugin.supervisor.metrics.render().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (sample.name, sample.labels.get("resource")) == (HELD_GAUGE, resource):
                return sample.value
    raise AssertionError(f"no {HELD_GAUGE} sample for {resource}")


async def changes_done(plugin: Plugin) -> None:
    """Return once every change begun on the plugin's serialized path has ended."""

    async def nothing() -> None:
        return None

    await plugin.supervisor.engine.change(nothing, None)


def test_a_claimed_gpu_is_unhealthy_from_the_start_until_its_claim_is_released(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="deviceplugin")

    async def body() -> None:
        async with running_plugin(pod_resources=claim_whole_gpu) as plugin:
            kubelet, pods = plugin.kubelet, plugin.pods
            assert pods is not None
            held = ids_on(plugin, GPU, gpu_uuid(plugin, WHOLE))
            assert len(held) == 2  # the seed config's two replicas
            # from the first list the kubelet got: never offered while the claim holds it
            assert unhealthy_at_kubelet(plugin, GPU) == held
            assert kubelet.allocatable(GPU) == 6 and kubelet.allocatable(MIG) == 28
            assert advertised(plugin, GPU, held[0]).reason == HOLD
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await kubelet.allocate(GPU, [[held[1]]])
            assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert held[1] in (refused.value.details() or "")
            assert HOLD in (refused.value.details() or "")
            chosen = await kubelet.preferred(GPU, sorted(kubelet.devices(GPU)), [], 8)
            assert len(chosen) == 6 and not set(chosen) & set(held)

            document = holds(plugin)
            assert document["known"] is True and document["error"] is None
            assert document["devices"] == {GPU: held}
            assert document["held"] == [
                {
                    "gpu": gpu_uuid(plugin, WHOLE),
                    "holder": "ml/trainer",
                    "source": "claim ml/gpus: gpu.nvidia.com/gpu-4",
                }
            ]
            assert held_gauge(plugin, GPU) == 2 and held_gauge(plugin, MIG) == 0
            status = plugin.supervisor.status()
            shown = build_snapshot(status.resources, plugin.supervisor.config, None, status=status)
            assert shown["dra_holds"] == document  # /status

            pods.release("ml", "trainer")
            await plugin.until(lambda: kubelet.allocatable(GPU) == 8)
            assert unhealthy_at_kubelet(plugin, GPU) == []
            assert (await kubelet.allocate(GPU, [[held[1]]])).container_responses
            assert holds(plugin)["devices"] == {}
            assert held_gauge(plugin, GPU) == 0

    run(body())
    changed = [r for r in caplog.records if r.getMessage() == "plugin.dra-holds.changed"]
    assert [len(r.dp_fields["held"]) for r in changed] == [1, 0]


def test_a_claimed_mig_device_withholds_that_mig_device_only() -> None:
    async def body() -> None:
        async with running_plugin(pod_resources=lambda pods: None) as plugin:
            kubelet, pods = plugin.kubelet, plugin.pods
            assert pods is not None and kubelet.allocatable(MIG) == 28
            inventory = plugin.supervisor.inventory
            assert inventory is not None
            mig = inventory.gpus[SLICED].mig_devices[2]
            name = f"gpu-{SLICED}-mig-{mig.gpu_instance_id}-{mig.compute_instance_id}"
            pods.assign_claim("ml", "notebook", "lab", "ml", "slice", DRIVER, "node-a", name)
            pods.assign_claim(
                "ml", "notebook", "lab", "ml", "domain", DRIVER, "node-a", "channel-0"
            )
            await plugin.until(lambda: kubelet.allocatable(MIG) == 27)
            assert unhealthy_at_kubelet(plugin, MIG) == [mig.uuid]
            assert kubelet.allocatable(GPU) == 8
            reason = advertised(plugin, MIG, mig.uuid).reason
            assert (
                reason == f"held by claim ml/slice: {DRIVER}/{name} (pod ml/notebook) through DRA"
            )

            pods.release("ml", "notebook")
            await plugin.until(lambda: kubelet.allocatable(MIG) == 28)

    run(body())


def test_an_xid_unhealthy_gpu_stays_unhealthy_when_its_claim_is_released() -> None:
    async def body() -> None:
        async with running_plugin(pod_resources=claim_whole_gpu) as plugin:
            kubelet, pods = plugin.kubelet, plugin.pods
            assert pods is not None
            held = ids_on(plugin, GPU, gpu_uuid(plugin, WHOLE))
            plugin.event(uuid=gpu_uuid(plugin, WHOLE), xid=79)
            await plugin.until(lambda: advertised(plugin, GPU, held[0]).reason == "xid-79")

            pods.release("ml", "trainer")
            await plugin.until(lambda: holds(plugin)["devices"] == {})
            await changes_done(plugin)
            assert [advertised(plugin, GPU, i).health for i in held] == [Health.UNHEALTHY] * 2
            assert unhealthy_at_kubelet(plugin, GPU) == held
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await kubelet.allocate(GPU, [[held[0]]])
            assert "xid-79" in (refused.value.details() or "")

    run(body())


def test_a_held_gpu_stays_unhealthy_when_its_health_recovers() -> None:
    async def body() -> None:
        async with running_plugin(pod_resources=claim_whole_gpu, recovery="1s") as plugin:
            uuid = gpu_uuid(plugin, WHOLE)
            held = ids_on(plugin, GPU, uuid)
            plugin.event(uuid=uuid, xid=48)
            await plugin.until(lambda: advertised(plugin, GPU, held[0]).reason == "xid-48")
            # recovered after the hold-down: the claim's hold shows again, not Healthy
            await plugin.until(lambda: advertised(plugin, GPU, held[0]).reason == HOLD)
            assert uuid not in plugin.supervisor.engine.unhealthy
            assert [advertised(plugin, GPU, i).health for i in held] == [Health.UNHEALTHY] * 2
            assert plugin.kubelet.allocatable(GPU) == 6

    run(body())


def test_a_socket_that_stops_answering_releases_nothing(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="deviceplugin")

    async def body() -> None:
        async with running_plugin(pod_resources=claim_whole_gpu) as plugin:
            kubelet, pods = plugin.kubelet, plugin.pods
            assert pods is not None
            held = ids_on(plugin, GPU, gpu_uuid(plugin, WHOLE))
            checks = count_calls(plugin, "check_dra_holds")
            with refusing(pods.socket):
                await plugin.until(lambda: holds(plugin)["known"] is False)
                assert str(pods.socket) in holds(plugin)["error"]
                seen = checks()
                await plugin.until(lambda: checks() >= seen + 3)  # three more failed Lists
                await changes_done(plugin)
                assert unhealthy_at_kubelet(plugin, GPU) == held
                assert holds(plugin)["devices"] == {GPU: held}
            await plugin.until(lambda: holds(plugin)["known"] is True)
            assert holds(plugin)["devices"] == {GPU: held}

            await pods.stop()  # no socket: no DRA on this node any more, nothing held
            await plugin.until(lambda: kubelet.allocatable(GPU) == 8)

    run(body())
    events = [r.getMessage() for r in caplog.records if "dra-holds" in r.getMessage()]
    assert events[:3] == [
        "plugin.dra-holds.changed",
        "plugin.dra-holds.unknown",  # once, however many Lists failed
        "plugin.dra-holds.known",
    ]
    # The emulator stopping may refuse one List before its socket is gone: unknown, known again.
    assert events[3:] in (
        ["plugin.dra-holds.changed"],
        ["plugin.dra-holds.unknown", "plugin.dra-holds.known", "plugin.dra-holds.changed"],
    ), events


def count_calls(plugin: Plugin, method: str) -> Callable[[], int]:
    """Count the calls of the supervisor's `method` from now on: the periodic check calls it
    on the supervisor, so the count says how many turns it has made."""
    supervisor = plugin.supervisor
    original = getattr(supervisor, method)
    calls = [0]

    async def counted() -> None:
        calls[0] += 1
        await original()

    setattr(supervisor, method, counted)
    return lambda: calls[0]


@contextlib.contextmanager
def refusing(path: Path) -> Iterator[None]:
    """Put a unix socket nobody listens on at `path`, the emulator's own moved aside (it keeps
    serving, unreachable): the socket exists and refuses every connection, as a kubelet that
    is going down does. Afterwards the emulator's socket is back."""
    aside = path.with_name("serving.sock")
    path.rename(aside)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as bare:
        bare.bind(str(path))
        try:
            yield
        finally:
            path.unlink()
            aside.rename(path)


def _device(uuid: str, health: Health = Health.HEALTHY, reason: str = "") -> Device:
    return Device(
        id=uuid,
        physical_uuid=uuid,
        gpu_uuid=uuid,
        gpu_index=0,
        gpu_minor=0,
        numa_node=None,
        health=health,
        reason=reason,
    )


def test_withhold_marks_held_healthy_ids_and_keeps_other_reasons() -> None:
    resource = ResourceSet(
        GPU,
        (_device("GPU-a"), _device("GPU-b", Health.UNHEALTHY, "xid-79"), _device("GPU-c")),
    )
    held = {GPU: {"GPU-a": "held by A", "GPU-b": "held by B"}, "gone/resource": {"x": "y"}}
    devices = withhold({GPU: resource}, held)[GPU].devices
    assert [(d.id, d.health, d.reason) for d in devices] == [
        ("GPU-a", Health.UNHEALTHY, "held by A"),
        ("GPU-b", Health.UNHEALTHY, "xid-79"),
        ("GPU-c", Health.HEALTHY, ""),
    ]
    assert withhold({GPU: resource}, {}) == {GPU: resource}


def test_a_gpu_another_device_plugin_gave_a_running_pod_is_not_offered_again() -> None:
    """NVIDIA's plugin served the node (IDs: bare UUIDs, or index IDs) and a pod still holds a
    GPU: our replicas of it stay Unhealthy until the pod ends. Our own IDs, and replica IDs of a
    GPU we share by replicas ourselves (an old replica count), hold nothing."""

    async def body() -> None:
        async with running_plugin(pod_resources=lambda pods: None) as plugin:
            kubelet, pods = plugin.kubelet, plugin.pods
            assert pods is not None and kubelet.allocatable(GPU) == 8
            held_gpu, other_gpu = gpu_uuid(plugin, WHOLE), gpu_uuid(plugin, WHOLE + 1)
            pods.assign("default", "ours", "main", GPU, [f"{other_gpu}::1"])
            pods.assign("default", "older", "main", GPU, [f"{other_gpu}::7"])
            await changes_done(plugin)
            await plugin.until(lambda: holds(plugin)["held_by_other_plugins"] == [])
            assert kubelet.allocatable(GPU) == 8
            pods.assign("default", "nvidia", "main", GPU, [held_gpu])
            await plugin.until(lambda: kubelet.allocatable(GPU) == 6)
            held = ids_on(plugin, GPU, held_gpu)
            assert unhealthy_at_kubelet(plugin, GPU) == held
            assert advertised(plugin, GPU, held[0]).reason == (
                f"held by {GPU} {held_gpu} (pod default/nvidia) from another device plugin"
            )
            (entry,) = holds(plugin)["held_by_other_plugins"]
            assert (entry["gpu"], entry["holder"]) == (held_gpu, "default/nvidia")

            pods.release("default", "nvidia")
            await plugin.until(lambda: kubelet.allocatable(GPU) == 8)
            assert holds(plugin)["held_by_other_plugins"] == []

    run(body())
