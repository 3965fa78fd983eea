"""End to end: the real plugin on simulated nodes, driven by the kubelet emulator over real
unix sockets, as the kubelet drives it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from harness import GPU, MIG, SEED, run, running_plugin

from deviceplugin.sim.kubelet import KubeletEmulator


@pytest.fixture(params=["simulate", "driver-root"])
def plugin_flags(
    request: pytest.FixtureRequest, tmp_path: Path, fresh_sim_root: Callable[[str, Path], Path]
) -> dict[str, Any]:
    """`serve --simulate a100-80gb-x8-mixed`, or `serve --nvidia-driver-root` on that node's
    sim-root: nvidia-ml-py on the simulated libnvidia-ml.so.1, the production path."""
    if request.param == "simulate":
        return {}
    return {"driver_root": fresh_sim_root("a100-80gb-x8-mixed", tmp_path / "root")}


def test_seed_config_registers_replicas_and_mig_devices(plugin_flags: dict[str, Any]) -> None:
    async def body() -> None:
        async with running_plugin(**plugin_flags) as plugin:
            kubelet = plugin.kubelet
            assert kubelet.resources() == [GPU, MIG]
            assert kubelet.allocatable(GPU) == 8 and len(kubelet.devices(GPU)) == 8
            assert kubelet.allocatable(MIG) == 28
            assert all("::" in device_id for device_id in kubelet.devices(GPU))
            assert {kubelet.endpoints[GPU].endpoint, kubelet.endpoints[MIG].endpoint} == {
                "nvidia-gpu.sock",
                "nvidia-mig-1g.10gb.sock",
            }
            assert all(r.ok and r.version == "v1beta1" for r in kubelet.registrations)
            numa = {d.numa_nodes for d in kubelet.devices(GPU).values()}
            assert numa == {(1,)}, "the whole GPUs of the preset sit on NUMA node 1"
            assert kubelet.endpoints[GPU].options.get_preferred_allocation_available

    run(body())


@pytest.mark.parametrize(
    ("preset", "expected"),
    [
        pytest.param("a30-x4-mig", {"nvidia.com/gpu": 4}, id="a30-none-strategy"),
        pytest.param("a10-x8", {"nvidia.com/gpu": 8}, id="a10"),
        pytest.param("h100-x8", {"nvidia.com/gpu": 8}, id="h100"),
    ],
)
def test_presets_with_default_config(preset: str, expected: dict[str, int]) -> None:
    async def body() -> None:
        async with running_plugin(simulate=preset, config_text="version: v1\n") as plugin:
            assert {
                r: plugin.kubelet.allocatable(r) for r in plugin.kubelet.resources()
            } == expected

    run(body())


def test_a30_mixed_advertises_each_mig_profile() -> None:
    async def body() -> None:
        text = "version: v1\nflags: {migStrategy: mixed}\n"
        async with running_plugin(simulate="a30-x4-mig", config_text=text) as plugin:
            assert plugin.kubelet.resources() == ["nvidia.com/mig-1g.6gb"]
            assert plugin.kubelet.allocatable("nvidia.com/mig-1g.6gb") == 16

    run(body())


def test_allocate_maps_replicas_and_mig_devices_to_physical_uuids() -> None:
    async def body() -> None:
        async with running_plugin() as plugin:
            kubelet = plugin.kubelet
            replicas = sorted(kubelet.devices(GPU))
            same_gpu = [i for i in replicas if i.startswith(replicas[0].split("::")[0])]
            response = await kubelet.allocate(GPU, [same_gpu, [replicas[-1]]])
            assert len(response.container_responses) == 2
            first, second = (dict(r.envs) for r in response.container_responses)
            # The reference's GDRCopy, GDS and MOFED switches are on by default.
            features = dict.fromkeys(("NVIDIA_GDRCOPY", "NVIDIA_GDS", "NVIDIA_MOFED"), "enabled")
            assert first == {"NVIDIA_VISIBLE_DEVICES": same_gpu[0].split("::")[0], **features}
            assert second == {"NVIDIA_VISIBLE_DEVICES": replicas[-1].split("::")[0], **features}
            mig = sorted(kubelet.devices(MIG))[3]
            response = await kubelet.allocate(MIG, [[mig]])
            envs = dict(response.container_responses[0].envs)
            assert envs == {"NVIDIA_VISIBLE_DEVICES": mig, **features}

    run(body())


def test_unknown_ids_are_refused_and_the_server_keeps_serving() -> None:
    async def body() -> None:
        async with running_plugin() as plugin:
            kubelet = plugin.kubelet
            for _ in range(3):
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await kubelet.allocate(GPU, [["GPU-nope::0"]])
                assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
                assert "GPU-nope::0" in (caught.value.details() or "")
            good = sorted(kubelet.devices(GPU))[0]
            assert (await kubelet.allocate(GPU, [[good]])).container_responses

    run(body())


def test_xid_marks_every_replica_in_one_update_and_allocate_refuses_them(
    plugin_flags: dict[str, Any],
) -> None:
    async def body() -> None:
        async with running_plugin(**plugin_flags) as plugin:
            kubelet = plugin.kubelet
            victim = sorted(kubelet.devices(GPU))[0].split("::")[0]
            mig_updates = kubelet.endpoints[MIG].updates
            gpu_updates = kubelet.endpoints[GPU].updates
            plugin.event(uuid=victim, xid=79)
            await plugin.until(lambda: kubelet.allocatable(GPU) == 6)
            assert kubelet.endpoints[GPU].updates == gpu_updates + 1
            assert kubelet.endpoints[MIG].updates == mig_updates, "MIG resource untouched"
            bad = sorted(i for i, d in kubelet.devices(GPU).items() if not d.healthy)
            assert bad == [f"{victim}::0", f"{victim}::1"]
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await kubelet.allocate(GPU, [[bad[1]]])
            assert bad[1] in caught.value.details() and "xid-79" in caught.value.details()
            preferred = await kubelet.preferred(GPU, sorted(kubelet.devices(GPU)), [], 6)
            assert len(preferred) == 6 and not set(preferred) & set(bad)

    run(body())


def test_xid_on_a_mig_device_marks_only_that_device(plugin_flags: dict[str, Any]) -> None:
    async def body() -> None:
        async with running_plugin(**plugin_flags) as plugin:
            kubelet = plugin.kubelet
            target = sorted(kubelet.devices(MIG))[5]
            plugin.event(uuid=target, xid=94)
            await plugin.until(lambda: kubelet.allocatable(MIG) == 27)
            assert [i for i, d in kubelet.devices(MIG).items() if not d.healthy] == [target]
            assert kubelet.allocatable(GPU) == 8

    run(body())


def test_preferred_allocation_is_deterministic_and_valid() -> None:
    async def body() -> None:
        async with running_plugin(simulate="a10-x8", config_text="version: v1\n") as plugin:
            kubelet = plugin.kubelet
            ids = sorted(kubelet.devices(GPU))
            first = await kubelet.preferred(GPU, ids, [], 4)
            again = await kubelet.preferred(GPU, list(reversed(ids)), [], 4)
            assert first == again and len(set(first)) == 4 and set(first) <= set(ids)
            numa = {kubelet.devices(GPU)[i].numa_nodes for i in first}
            assert len(numa) == 1, "four GPUs fit on one NUMA node of the a10-x8 preset"

    run(body())


def test_plugin_waits_for_a_kubelet_that_is_not_up_yet() -> None:
    async def body() -> None:
        async with running_plugin(start_kubelet=False, wait_registered=False) as plugin:
            failures = plugin.supervisor.metrics.registration_failures
            await plugin.until(lambda: failures.labels(MIG)._value.get() >= 1)
            assert not plugin.supervisor.status().ready
            kubelet: KubeletEmulator = plugin.kubelet
            await kubelet.start()
            await plugin.until(
                lambda: kubelet.allocatable(MIG) == 28 and kubelet.allocatable(GPU) == 8, timeout=15
            )
            await plugin.until(lambda: plugin.supervisor.status().ready)

    run(body())


def test_seed_template_is_the_configmap_in_config_dir() -> None:
    from pathlib import Path

    seed_file = Path(__file__).resolve().parent.parent / "config" / "seed.yaml"
    assert "replicas: 2" in seed_file.read_text() and "replicas: {replicas}" in SEED
