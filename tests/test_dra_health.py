"""The resource-health service (KEP-4680) over the real DRA socket: the plugin-watcher emulator
follows it as the kubelet's DRA manager does, so a prepared device's health shows in what the
kubelet puts in the pod's `allocatedResourcesStatus`; v1 and v1alpha1; a kubelet with the
ResourceHealthStatus gate off; the stream's own rhythm (first list, changes, re-sends, close)."""

from __future__ import annotations

import asyncio
import shutil

import grpc
import pytest

from deviceplugin.dra.devicehealth import (
    HEALTH_TIMEOUT_SECONDS,
    DeviceState,
    HealthReporter,
    device_states,
)
from deviceplugin.dra.kubeletcalls import KubeletCalls
from deviceplugin.model.slices import device_name
from deviceplugin.node.unixgrpc import close_unix, listen_unix
from deviceplugin.sim.pluginwatcher import PluginWatcher
from deviceplugin.wire.drahealth.v1 import api_pb2 as v1
from deviceplugin.wire.drahealth.v1 import api_pb2_grpc as v1_grpc
from tests.dranode import inventory
from tests.draplugin import DRIVER, NODE, PRESET, claim, published, run, running_driver, short_dir

FOUND = inventory(PRESET)
WHOLE = next(gpu for gpu in FOUND.gpus if not gpu.mig_enabled)
PARENT = next(gpu for gpu in FOUND.gpus if gpu.mig_enabled and len(gpu.mig_devices) > 1)
MIG = PARENT.mig_devices[0]
WHOLE_NAME = device_name(WHOLE, None)
MIG_NAME = device_name(PARENT, MIG)
KIND = "k8s.gpu.nvidia.com/claim"


@pytest.mark.parametrize("library", [False, True], ids=["simulate", "driver-root"])
def test_a_prepared_devices_health_reaches_the_pod_status_and_comes_back(library: bool) -> None:
    async def body() -> None:
        async with running_driver(recovery="1s", library=library) as node:
            plugin = node.watcher.plugins[DRIVER]
            assert plugin.health_service == "v1.DRAResourceHealth"
            await node.until(lambda: plugin.health_reports > 0)
            assert set(plugin.health) == {(NODE, name) for name in published(node.server)}
            assert {seen.health for seen in plugin.health.values()} == {"HEALTHY"}
            assert {seen.timeout for seen in plugin.health.values()} == {HEALTH_TIMEOUT_SECONDS}

            ref = node.add_claim(claim("watched", [("gpu", WHOLE_NAME), ("mig", MIG_NAME)]))
            uid = ref[2]
            assert (await node.watcher.prepare(DRIVER, [ref])).claims[uid].error == ""

            def status() -> dict[str, dict[str, str]]:
                return {e["resourceID"]: e for e in node.watcher.resource_health(DRIVER, uid)}

            whole_id, mig_id = f"{KIND}={uid}-{WHOLE_NAME}", f"{KIND}={uid}-{MIG_NAME}"
            assert {k: e["health"] for k, e in status().items()} == {
                whole_id: "Healthy",
                mig_id: "Healthy",
            }

            node.event(uuid=PARENT.uuid, xid=79)  # the MIG device's GPU falls off the bus
            await node.until(lambda: status()[mig_id]["health"] == "Unhealthy")
            assert "79" in status()[mig_id]["message"]
            assert status()[whole_id] == {"resourceID": whole_id, "health": "Healthy"}
            await node.until(lambda: status()[mig_id]["health"] == "Healthy", 10.0)
            assert "message" not in status()[mig_id]
            # /status says which versions this kubelet uses
            used = node.driver.status().document()["kubelet_api"]
            assert set(used) == {"v1.DRAPlugin", "v1.DRAResourceHealth"}
            assert used["v1.DRAPlugin"]["calls"] == 1 and used["v1.DRAResourceHealth"]["calls"] >= 1

    run(body)


def test_a_kubelet_that_knows_only_v1alpha1_health_follows_it() -> None:
    async def body() -> None:
        async with running_driver(watcher=False) as node:
            old = PluginWatcher(
                node.kubelet_root,
                services=("v1beta1.DRAPlugin",),
                health_services=("v1alpha1.DRAResourceHealth",),
            )
            await old.start()
            try:
                plugin = await old.wait_registered(DRIVER)
                assert plugin.health_service == "v1alpha1.DRAResourceHealth"
                await node.until(lambda: plugin.health_reports > 0)
                assert (NODE, WHOLE_NAME) in plugin.health
                node.event(uuid=WHOLE.uuid, xid=48)
                await node.until(lambda: plugin.health[(NODE, WHOLE_NAME)].health == "UNHEALTHY")
                ref = node.add_claim(claim("old", [("gpu", MIG_NAME)]))
                await old.prepare(DRIVER, [ref], version="v1beta1.DRAPlugin")
                used = node.driver.status().document()["kubelet_api"]
                assert set(used) == {"v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth"}
            finally:
                await old.stop()

    run(body)


def test_with_the_gate_off_the_kubelet_opens_no_stream_and_claims_still_prepare() -> None:
    async def body() -> None:
        async with running_driver(watcher=False) as node:
            gated = PluginWatcher(node.kubelet_root, health_gate=False)
            await gated.start()
            try:
                plugin = await gated.wait_registered(DRIVER)
                assert plugin.health_service == "v1.DRAResourceHealth"  # offered, not followed
                assert plugin.health_task is None
                ref = node.add_claim(claim("ungated", [("gpu", WHOLE_NAME)]))
                entry = (await gated.prepare(DRIVER, [ref])).claims[ref[2]]
                assert entry.error == "" and [d.device_name for d in entry.devices] == [WHOLE_NAME]
                assert gated.resource_health(DRIVER, ref[2]) == []
                assert plugin.health_reports == 0
            finally:
                await gated.stop()

    run(body)


def test_a_stream_sends_at_once_resends_unchanged_follows_changes_and_ends_on_close() -> None:
    async def body() -> None:
        root = short_dir("drahealth")
        socket = root / "dra.sock"
        reporter = HealthReporter(NODE, resend_seconds=0.02, timeout_seconds=7)
        await reporter.update((DeviceState("gpu-0", True), DeviceState("gpu-1", True)))
        server = await listen_unix(socket, lambda s: reporter.add_to(s, KubeletCalls()))
        channel = grpc.aio.insecure_channel(f"unix://{socket}")
        try:
            async with asyncio.timeout(10):
                call = v1_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
                    v1.NodeWatchResourcesRequest()
                )
                for _ in range(3):  # nothing changes: the same list, again and again
                    message = await call.read()
                    assert [
                        (d.device.pool_name, d.device.device_name, d.health)
                        for d in message.devices
                    ] == [(NODE, "gpu-0", v1.HEALTHY), (NODE, "gpu-1", v1.HEALTHY)]
                    assert {d.health_check_timeout_seconds for d in message.devices} == {7}
                    assert all(d.last_updated_time > 0 for d in message.devices)
                assert await reporter.update(
                    (DeviceState("gpu-0", True), DeviceState("gpu-1", False, "x" * 2000))
                )
                assert not await reporter.update(reporter.states)
                while (await call.read()).devices[1].health != v1.UNHEALTHY:
                    pass
                message = await call.read()
                assert message.devices[1].message == "x" * 1024
                await reporter.close()
                while (await call.read()) is not grpc.aio.EOF:
                    pass
        finally:
            await channel.close(None)
            await close_unix(server, socket, 0)
            shutil.rmtree(root, ignore_errors=True)

    run(body)


def test_a_mig_device_takes_its_own_reason_first_then_its_gpus() -> None:
    devices = {WHOLE_NAME: (WHOLE, None), MIG_NAME: (PARENT, MIG)}
    other = PARENT.mig_devices[1]
    devices[device_name(PARENT, other)] = (PARENT, other)
    states = {
        s.device: s for s in device_states(devices, {PARENT.uuid: "Xid 79", MIG.uuid: "Xid 94"})
    }
    assert states[MIG_NAME] == DeviceState(MIG_NAME, False, "Xid 94")
    assert states[device_name(PARENT, other)].reason == "Xid 79"
    assert states[WHOLE_NAME] == DeviceState(WHOLE_NAME, True)


def test_the_slices_are_the_same_on_the_simulated_library() -> None:
    """`dra serve --simulate` and `dra serve --nvidia-driver-root` on the node's sim-root (the
    production path, nvidia-ml-py on the simulated libnvidia-ml.so.1) publish the same slices."""

    async def body() -> None:
        async with running_driver() as simulated:
            expected = published(simulated.server)
        async with running_driver(library=True) as real:
            assert published(real.server) == expected
        assert len(expected) > 8

    run(body)
