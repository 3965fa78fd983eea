"""One owner per GPU through a migration: once the device plugin leaves a node whose pods still
hold its GPUs, the DRA driver publishes everything but what those pods hold (as the kubelet's
PodResources reports it, through the real gRPC socket), publishes each again once its pod is
gone, and publishes nothing new as free while it cannot tell."""

from __future__ import annotations

import asyncio
import contextlib
import json
import select
import socket
from collections.abc import AsyncIterator
from pathlib import Path

from deviceplugin.model.devices import Gpu, Inventory
from deviceplugin.model.slices import device_name
from deviceplugin.sim.podresources import PodResourcesEmulator
from tests.draplugin import DRIVER, Node, claim, published, run, running_driver

ALL_DEVICES = 32  # a100-80gb-x8-mixed as DRA publishes it


def plugin_socket(node: Node) -> socket.socket:
    """A device plugin serving `nvidia.com/gpu` on the node."""
    return plugin_socket_at(node.kubelet_root / "device-plugins" / "nvidia-gpu.sock")


def plugin_socket_at(path: Path) -> socket.socket:
    """A unix socket at `path` that accepts connections and never answers."""
    path.parent.mkdir(parents=True, exist_ok=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen()
    return server


async def plugin_serving(node: Node) -> socket.socket:
    """A device plugin serving, and the driver's check having seen it."""
    plugin = plugin_socket(node)
    await node.driver.check_node()
    return plugin


@contextlib.asynccontextmanager
async def kubelet_pods(node: Node) -> AsyncIterator[PodResourcesEmulator]:
    """The kubelet's PodResources on the node, serving while the block runs."""
    pods = PodResourcesEmulator(node.kubelet_root)
    await pods.start()
    try:
        yield pods
    finally:
        await pods.stop()


def inventory(node: Node) -> Inventory:
    found = node.driver.inventory
    assert found is not None
    return found


def whole_gpus(node: Node) -> list[Gpu]:
    return [gpu for gpu in inventory(node).gpus if not gpu.mig_enabled]


def mig_gpus(node: Node) -> list[Gpu]:
    return [gpu for gpu in inventory(node).gpus if gpu.mig_enabled and gpu.mig_devices]


async def plugin_leaves(node: Node, plugin: socket.socket) -> None:
    plugin.close()  # its socket file stays behind, refusing connections
    await node.driver.check_node()


def test_pods_of_a_departed_plugin_keep_their_gpus_until_they_end() -> None:
    async def body() -> None:
        async with running_driver() as node, kubelet_pods(node) as pods:
            plugin = await plugin_serving(node)
            await node.until(lambda: len(published(node.server)) == 0)
            gpu = whole_gpus(node)[1]
            mig_gpu = mig_gpus(node)[0]
            mig = mig_gpu.mig_devices[0]
            # ours (UUID replica) and NVIDIA's index strategy (`<gpu>:<mig>`)
            pods.assign("team", "trainer", "main", "nvidia.com/gpu", [f"{gpu.uuid}::3"])
            pods.assign(
                "team", "tuner", "main", "nvidia.com/mig-1g.10gb",
                [f"{mig_gpu.index}:{mig.index}"],
            )  # fmt: skip
            await plugin_leaves(node, plugin)
            await node.until(lambda: len(published(node.server)) == ALL_DEVICES - 2)
            names = published(node.server)
            assert device_name(gpu, None) not in names
            assert device_name(mig_gpu, mig) not in names
            assert device_name(mig_gpu, mig_gpu.mig_devices[1]) in names
            document = node.driver.status().document()
            held = document["held_by_device_plugins"]
            assert {(h["gpu"], h.get("mig"), h["holder"]) for h in held} == {
                (gpu.uuid, None, "team/trainer"),
                (mig_gpu.uuid, mig.uuid, "team/tuner"),
            }
            assert document["ready"], document["not_ready"]
            metrics = node.driver.metrics
            metrics.set_status(node.driver.status())
            assert metrics.registry.get_sample_value("deviceplugin_dra_devices_held") == 2

            pods.release("team", "trainer")
            await node.driver.check_node()
            await node.until(lambda: device_name(gpu, None) in published(node.server))
            assert device_name(mig_gpu, mig) not in published(node.server)
            pods.release("team", "tuner")
            await node.driver.check_node()
            await node.until(lambda: len(published(node.server)) == ALL_DEVICES)
            assert node.driver.status().document()["held_by_device_plugins"] == []

    run(body)


def test_nothing_new_is_published_while_the_holdings_cannot_be_read() -> None:
    async def body() -> None:
        async with running_driver() as node:
            plugin = plugin_socket(node)
            await node.driver.check_node()
            await node.until(lambda: len(published(node.server)) == 0)
            await plugin_leaves(node, plugin)  # and no PodResources socket on the node
            await node.driver.check_node()
            await node.synced()
            assert len(published(node.server)) == 0
            reasons = node.driver.status().not_ready
            assert any("pod-resources" in r and "nothing new" in r for r in reasons), reasons

            async with kubelet_pods(node) as pods:
                gpu = whole_gpus(node)[0]
                pods.assign("team", "trainer", "main", "nvidia.com/gpu", [gpu.uuid])
                await node.driver.check_node()
                await node.until(lambda: len(published(node.server)) == ALL_DEVICES - 1)
                assert node.driver.status().not_ready == []
            # Known once, then unreadable: the GPU stays withheld though its pod may have ended.
            await node.driver.check_node()
            await node.synced()
            assert device_name(gpu, None) not in published(node.server)
            assert len(published(node.server)) == ALL_DEVICES - 1
            assert node.driver.status().not_ready

    run(body)


def test_an_id_that_cannot_be_mapped_withholds_every_gpu_it_could_belong_to() -> None:
    async def body() -> None:
        async with running_driver() as node, kubelet_pods(node) as pods:
            plugin = await plugin_serving(node)
            mig_gpu = mig_gpus(node)[0]
            absent = max(m.index for m in mig_gpu.mig_devices) + 1
            pods.assign("a", "p", "c", "nvidia.com/mig-1g.10gb", [f"{mig_gpu.index}:{absent}"])
            # another vendor's index IDs and a GPU this node does not have: not ours
            pods.assign("a", "q", "c", "example.com/fpga", ["0", "1"])
            pods.assign("a", "r", "c", "nvidia.com/gpu", ["GPU-00000000-dead"])
            await plugin_leaves(node, plugin)
            await node.synced()
            names = published(node.server)
            assert len(names) == ALL_DEVICES - len(mig_gpu.mig_devices)
            assert not any(device_name(mig_gpu, m) in names for m in mig_gpu.mig_devices)
            held = node.driver.status().document()["held_by_device_plugins"]
            assert [h["gpu"] for h in held] == [mig_gpu.uuid]
            assert "no MIG device" in held[0]["unmapped"]

    run(body)


def test_a_restarted_driver_withholds_what_the_kubelet_says_plugin_pods_hold() -> None:
    async def body() -> None:
        async with running_driver() as node:
            # The plugin left before this driver started; the kubelet's checkpoint remembers.
            checkpoint = node.kubelet_root / "device-plugins" / "kubelet_internal_checkpoint"
            checkpoint.parent.mkdir(parents=True, exist_ok=True)
            gpu = whole_gpus(node)[0]
            entry = {"PodUID": "u", "ContainerName": "c", "ResourceName": "nvidia.com/gpu"}
            checkpoint.write_text(json.dumps({"Data": {"PodDeviceEntries": [entry]}}))
            await node.restart()
            assert len(published(node.server)) == 0  # no PodResources socket: unknown
            async with kubelet_pods(node) as pods:
                pods.assign("team", "trainer", "main", "nvidia.com/gpu", [str(gpu.index)])
                await node.restart()
                names = published(node.server)
                assert len(names) == ALL_DEVICES - 1
                assert device_name(gpu, None) not in names

    run(body)


def test_released_gpus_come_back_and_reads_stop_once_nothing_is_held() -> None:
    async def body() -> None:
        async with running_driver() as node, kubelet_pods(node) as pods:
            plugin = await plugin_serving(node)
            gpu = whole_gpus(node)[0]
            pods.assign("a", "p", "c", "nvidia.com/gpu", [gpu.uuid])
            await plugin_leaves(node, plugin)
            await node.until(lambda: len(published(node.server)) == ALL_DEVICES - 1)
            pods.release("a", "p")
            await node.driver.check_node()
            await node.until(lambda: len(published(node.server)) == ALL_DEVICES)
            # Nothing held any more: no further reads until a plugin comes and goes again.
            calls = pods.calls
            await node.driver.check_node()
            assert pods.calls == calls

    run(body)


def test_no_new_claim_is_prepared_on_what_a_device_plugin_has() -> None:
    """A claim allocated before the node changed hands is refused at Prepare while a device
    plugin serves, or while a pod it served holds the device; a claim prepared before keeps its
    device; a free device prepares."""

    async def body() -> None:
        async with running_driver() as node, kubelet_pods(node) as pods:
            held, free, before = whole_gpus(node)[:3]
            early = node.add_claim(claim("early", [("gpu", device_name(before, None))]))
            assert not (await node.watcher.prepare(DRIVER, [early])).claims[early[2]].error
            plugin = await plugin_serving(node)
            late = node.add_claim(claim("late", [("gpu", device_name(free, None))]))
            answer = (await node.watcher.prepare(DRIVER, [early, late])).claims
            assert not answer[early[2]].error  # prepared before: kept
            assert "nvidia-gpu.sock" in answer[late[2]].error
            assert "no new claim is prepared" in answer[late[2]].error

            pods.assign("team", "trainer", "main", "nvidia.com/gpu", [f"{held.uuid}::0"])
            await plugin_leaves(node, plugin)
            taken = node.add_claim(claim("taken", [("gpu", device_name(held, None))]))
            answer = (await node.watcher.prepare(DRIVER, [taken, late])).claims
            assert "held by pod team/trainer" in answer[taken[2]].error
            assert not answer[late[2]].error
            pods.release("team", "trainer")
            await node.driver.check_node()
            assert not (await node.watcher.prepare(DRIVER, [taken])).claims[taken[2]].error

    run(body)


def test_a_kubelet_that_does_not_answer_holds_no_other_change_up() -> None:
    """The PodResources List is awaited off the engine's serialized path: while it waits on a
    socket that accepts and never answers, a change of the engine (a health event, a reload)
    goes through."""

    async def body() -> None:
        async with running_driver() as node:
            plugin = await plugin_serving(node)
            silent = plugin_socket_at(node.kubelet_root / "pod-resources" / "kubelet.sock")
            try:
                plugin.close()
                checking = asyncio.create_task(node.driver.check_node())
                await node.until(lambda: bool(select.select([silent], [], [], 0)[0]))
                # the List has connected, and waits for an answer that never comes

                async def nothing() -> str:
                    return "changed"

                assert await node.driver.engine.change(nothing, "stopped") == "changed"
                assert node.driver.plugin_holds.unknown is None  # the List still waits
                await checking
                assert node.driver.status().document()["held_unknown"]
            finally:
                silent.close()

    run(body)
