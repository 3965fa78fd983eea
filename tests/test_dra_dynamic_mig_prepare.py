"""Dynamic MIG Prepare and Unprepare through the kubelet's real gRPC sockets, on the simulated
libnvidia-ml.so.1 of a driver root (the Python fake cannot cut): Prepare cuts exactly the GPU
and compute instance at the placement the scheduler chose, Unprepare removes them, a driver
killed at any step leaves one prepared claim and no orphan once started again, and instances
someone else made are left alone, reported and published as taken. What the library holds is
read back by a fresh Python process through nvidia-ml-py, as any other NVML consumer sees it."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pynvml
import pytest
from suites import first_quick
from test_dra_crash import TIMEOUT, Node
from test_dra_crash import node as restarted_node

from deviceplugin.cli import SERVE_ENV_VARS
from deviceplugin.dra.failpoints import (
    PREPARE_AFTER_CDI_SPEC,
    PREPARE_AFTER_CHECKPOINT,
    PREPARE_AFTER_COMPUTE_INSTANCE,
    PREPARE_AFTER_GPU_INSTANCE,
    PREPARE_BEFORE_GPU_INSTANCE,
)
from deviceplugin.node.nvml_mig import MigModule
from testbed.simnvml import mig_layout, on_library
from tests.draplugin import (
    DRIVER,
    NODE,
    claim,
    library_tree,
    published,
    resolve,
    run,
    running_driver,
    write_kubeconfig,
)

PRESET = "a100-80gb-x8-dynamic"  # A100 80GB, MIG mode on, no instances
THREE_G_AT_4 = "gpu-0-mig-3g40gb-9-4"
THREE_G_AT_0 = "gpu-0-mig-3g40gb-9-0"
ONE_G_AT_0 = "gpu-0-mig-1g10gb-19-0"

# A foreign 1g.10gb at start 0 with its compute instance, as an operator's nvidia-smi makes it.
FOREIGN = """
place = n.c_nvmlGpuInstancePlacement_t()
place.start, place.size = 0, 1
gi = n.nvmlDeviceCreateGpuInstanceWithPlacement(gpu, 19, ctypes.pointer(place))
n.nvmlGpuInstanceCreateComputeInstance(gi, n.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE)
"""


def read_back(root: Path) -> dict[str, Any]:
    """GPU 0's GPU instances as (profile id, start, size), its MIG device UUIDs and MIG mode."""
    gpu = mig_layout(root)[0]
    return {
        "gis": sorted([gi["profileId"], *gi["placement"]] for gi in gpu["gpuInstances"]),
        "migs": [mig["uuid"] for mig in gpu["migDevices"]],
        "mode": gpu["migMode"],
    }


def driver_root(node: Any) -> Path:
    return Path(node.settings.overrides["nvidia_driver_root"])


def checkpoint(kubelet: Path) -> dict[str, Any]:
    path = kubelet / "plugins" / DRIVER / "checkpoint.json"
    data: dict[str, Any] = json.loads(path.read_text())["data"]
    return data


# --- in process: the driver over the real sockets ------------------------------------------------


def test_prepare_cuts_exactly_the_chosen_placement_and_unprepare_removes_it() -> None:
    async def body() -> None:
        async with running_driver(PRESET, library=True, mig_mode="dynamic") as node:
            root = driver_root(node)
            ref = node.add_claim(claim("part", [("mig", THREE_G_AT_4)]))
            done = await node.watcher.prepare(DRIVER, [ref])
            entry = done.claims[ref[2]]
            assert entry.error == ""
            (device,) = entry.devices
            assert device.device_name == THREE_G_AT_4
            held = read_back(root)
            assert held["gis"] == [[9, 4, 4]]
            (uuid,) = held["migs"]
            saved = checkpoint(node.kubelet_root)["claims"][ref[2]]
            assert saved["state"] == "PrepareCompleted"
            partition = saved["devices"][0]["migPartition"]
            assert partition["uuid"] == uuid
            assert (partition["profileID"], partition["placementStart"]) == (9, 4)
            (cdi_id,) = device.cdi_device_ids
            nodes = [n["path"] for n in resolve(node.cdi_dir, cdi_id)["deviceNodes"]]
            assert "/dev/nvidia0" in nodes
            caps = [p for p in nodes if p.startswith("/dev/nvidia-caps/")]
            assert len(caps) == 2  # the GPU instance's and the compute instance's access

            again = await node.watcher.prepare(DRIVER, [ref])  # the kubelet's retry
            assert again.claims[ref[2]].error == ""
            assert read_back(root)["gis"] == [[9, 4, 4]]

            undone = await node.watcher.unprepare(DRIVER, [ref])
            assert undone.claims[ref[2]].error == ""
            after = read_back(root)
            assert after == {"gis": [], "migs": [], "mode": 1}  # MIG mode was on: left on
            assert list(node.cdi_dir.glob("*.json")) == []

    run(body)


def test_on_hopper_prepare_turns_mig_mode_on_and_unprepare_turns_it_off_again() -> None:
    """An H100 with MIG mode off is cut all the same: the mode takes effect at once on Hopper,
    so Prepare turns it on, and the Unprepare that leaves no instance turns it off again."""

    async def body() -> None:
        async with running_driver("h100-x8", library=True, mig_mode="dynamic") as node:
            root = driver_root(node)
            assert read_back(root) == {"gis": [], "migs": [], "mode": 0}
            first = node.add_claim(claim("hopper-a", [("mig", ONE_G_AT_0)]))
            second = node.add_claim(claim("hopper-b", [("mig", "gpu-0-mig-1g10gb-19-1")]))
            done = await node.watcher.prepare(DRIVER, [first, second])
            assert [done.claims[r[2]].error for r in (first, second)] == ["", ""]
            held = read_back(root)
            assert held["mode"] == 1 and held["gis"] == [[19, 0, 1], [19, 1, 1]]
            await node.watcher.unprepare(DRIVER, [first])
            assert read_back(root)["mode"] == 1  # an instance is left: the mode stays on
            undone = await node.watcher.unprepare(DRIVER, [second])
            assert undone.claims[second[2]].error == ""
            assert read_back(root) == {"gis": [], "migs": [], "mode": 0}

    run(body)


def test_two_claims_at_placements_that_do_not_overlap_both_prepare() -> None:
    async def body() -> None:
        async with running_driver(PRESET, library=True, mig_mode="dynamic") as node:
            first = node.add_claim(claim("first", [("mig", THREE_G_AT_0)]))
            second = node.add_claim(claim("second", [("mig", THREE_G_AT_4)]))
            done = await node.watcher.prepare(DRIVER, [first, second])
            assert [done.claims[r[2]].error for r in (first, second)] == ["", ""]
            held = read_back(driver_root(node))
            assert held["gis"] == [[9, 0, 4], [9, 4, 4]] and len(set(held["migs"])) == 2
            await node.watcher.unprepare(DRIVER, [first])
            assert read_back(driver_root(node))["gis"] == [[9, 4, 4]]

    run(body)


def test_a_placement_taken_by_someone_else_fails_prepare_and_is_left_alone() -> None:
    async def body() -> None:
        async with running_driver(PRESET, library=True, mig_mode="dynamic") as node:
            root = driver_root(node)
            on_library(root, FOREIGN)
            ref = node.add_claim(claim("late", [("mig", THREE_G_AT_0)]))
            done = await node.watcher.prepare(DRIVER, [ref])
            error = done.claims[ref[2]].error
            assert "placement 0+4" in error and "is taken by GPU instance" in error, error
            assert "left alone" in error
            assert read_back(root)["gis"] == [[19, 0, 1]]
            assert ref[2] not in checkpoint(node.kubelet_root)["claims"]
            assert list(node.cdi_dir.glob("*.json")) == []

    run(body)


def test_a_foreign_instance_is_left_alone_reported_and_blocks_its_placements() -> None:
    async def body() -> None:
        async with running_driver(PRESET, library=True, mig_mode="dynamic") as node:
            root = driver_root(node)
            on_library(root, FOREIGN)
            await node.restart()  # found at start-up
            assert read_back(root)["gis"] == [[19, 0, 1]]
            (report,) = node.driver.status().document()["foreign_mig_instances"]
            assert "GPU instance" in report and "profile 19" in report and "0+1" in report
            node.driver.metrics.set_status(node.driver.status())
            text = node.driver.metrics.render().decode()
            assert "deviceplugin_dra_foreign_mig_instances 1.0" in text
            devices = published(node.server)
            taken = {
                name
                for name, device in devices.items()
                if any(
                    t["key"] == f"{DRIVER}/mig-placement-taken" for t in device.get("taints", [])
                )
            }
            assert {"gpu-0", ONE_G_AT_0, THREE_G_AT_0, "gpu-0-mig-7g80gb-0-0"} <= taken
            assert THREE_G_AT_4 not in taken and "gpu-0-mig-1g10gb-19-1" not in taken
            assert not any(name.startswith("gpu-1") for name in taken)
            (effect,) = {t["effect"] for n in taken for t in devices[n]["taints"]}
            assert effect == "NoSchedule"
            assert node.server.rejected == []

            ref = node.add_claim(claim("beside", [("mig", THREE_G_AT_4)]))
            assert (await node.watcher.prepare(DRIVER, [ref])).claims[ref[2]].error == ""
            assert read_back(root)["gis"] == [[9, 4, 4], [19, 0, 1]]
            await node.watcher.unprepare(DRIVER, [ref])
            assert read_back(root)["gis"] == [[19, 0, 1]]

    run(body)


def test_a_gpu_instance_without_compute_instances_lists_its_compute_profiles(
    tmp_path: Path,
) -> None:
    """The library reports a GPU instance's compute profiles before it has a compute instance
    (it once divided by the missing instance's slice count)."""
    root = library_tree(PRESET)
    out = on_library(
        root,
        "place = n.c_nvmlGpuInstancePlacement_t()\n"
        "place.start, place.size = 4, 4\n"
        "gi = n.nvmlDeviceCreateGpuInstanceWithPlacement(gpu, 9, ctypes.pointer(place))\n"
        "info = n.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, 2, 0)\n"
        "print(info.sliceCount, info.multiprocessorCount)",
    )
    assert out.split() == ["3", "42"]


# --- a driver process killed in the middle of a cut -----------------------------------------------


async def serve(root: Path, url: str, library: Path, **env: str) -> asyncio.subprocess.Process:
    """`dra serve --mig-mode dynamic` on the simulated library under `library`, as a node
    runs it."""
    clean = {k: v for k, v in os.environ.items() if k not in SERVE_ENV_VARS}
    return await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "deviceplugin", "dra", "serve", "--mig-mode", "dynamic"),
        *("--nvidia-driver-root", str(library), "--node-name", NODE),
        *("--kubelet-root", str(root / "kubelet"), "--cdi-spec-dir", str(root / "cdi")),
        *("--kubeconfig", str(write_kubeconfig(root / "kubeconfig", url))),
        env={**clean, **env},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )


@dataclass
class LibraryNode(Node):
    """`dra serve --mig-mode dynamic` processes one after another on one simulated library, as
    a node restarts its driver."""

    library: Path = field(default_factory=lambda: library_tree(PRESET))

    async def serve(self, **env: str) -> asyncio.subprocess.Process:
        return await serve(self.root, self.server.url, self.library, **env)

    async def crash_preparing(self, point: str) -> tuple[str, str, str]:
        """Start armed at `point` and send a claim for THREE_G_AT_4, which kills the driver
        there; the claim as the kubelet names it."""
        await self.start(DP_FAILPOINT=point)
        uid = self.server.add_claim(claim("cut", [("mig", THREE_G_AT_4)]))["metadata"]["uid"]
        with pytest.raises(grpc.aio.AioRpcError):
            await self.watcher.prepare(DRIVER, [("default", "cut", uid)])
        await self.crashed()
        return "default", "cut", uid

    async def stop(self) -> str:
        """Stop the running driver; what it logged."""
        assert self.process is not None and self.process.stderr is not None
        self.process.terminate()
        await asyncio.wait_for(self.process.wait(), TIMEOUT)
        return (await self.process.stderr.read()).decode()


@pytest.mark.parametrize(
    "point",
    first_quick(
        [
            PREPARE_AFTER_GPU_INSTANCE,
            PREPARE_AFTER_COMPUTE_INSTANCE,
            PREPARE_AFTER_CDI_SPEC,
            PREPARE_AFTER_CHECKPOINT,
        ]
    ),
)
def test_a_driver_killed_while_cutting_leaves_one_prepared_claim_and_no_orphan(point: str) -> None:
    async def body() -> None:
        async with restarted_node(LibraryNode) as here:
            library, kubelet = here.library, here.root / "kubelet"
            ref = await here.crash_preparing(point)
            uid = ref[2]
            assert read_back(library)["gis"] == [[9, 4, 4]]  # cut before the crash
            kept = point == PREPARE_AFTER_CHECKPOINT

            await here.start()
            if not kept:  # rolled back at start-up: the instance destroyed
                assert read_back(library)["gis"] == []
                assert uid not in checkpoint(kubelet)["claims"]
            response = await here.watcher.prepare(DRIVER, [ref])
            assert response.claims[uid].error == ""
            held = read_back(library)
            assert held["gis"] == [[9, 4, 4]] and len(held["migs"]) == 1
            saved = checkpoint(kubelet)["claims"]
            assert list(saved) == [uid] and saved[uid]["state"] == "PrepareCompleted"
            assert saved[uid]["devices"][0]["migPartition"]["uuid"] == held["migs"][0]

            await here.watcher.unprepare(DRIVER, [ref])
            assert read_back(library)["gis"] == []
            assert checkpoint(kubelet)["claims"] == {}

    asyncio.run(body())


def gpu_instance_ids(root: Path) -> dict[tuple[int, int, int], int]:
    """GPU 0's GPU instances: (profile id, start, size) -> id."""
    return {
        (gi["profileId"], *gi["placement"]): gi["id"] for gi in mig_layout(root)[0]["gpuInstances"]
    }


def test_a_gpu_instance_is_checkpointed_before_its_compute_instance_and_destroyed_at_start() -> (
    None
):
    async def body() -> None:
        async with restarted_node(LibraryNode) as here:
            ref = await here.crash_preparing(PREPARE_AFTER_GPU_INSTANCE)
            (made,) = gpu_instance_ids(here.library).values()
            saved = checkpoint(here.root / "kubelet")["claims"][ref[2]]
            assert saved["state"] == "PrepareStarted"
            partition = saved["devices"][0]["migPartition"]
            assert partition["gpuInstanceID"] == made and "computeInstanceID" not in partition

            await here.start()  # rolls the claim back: the instance it recorded is its own
            assert read_back(here.library)["gis"] == []
            assert "dra.mig.destroyed" in await here.stop()

    asyncio.run(body())


# Between the crash and the restart an operator replaces the driver's GPU instance at 4+4 by
# one of their own with a compute instance; another instance first takes the freed id.
REPLACED = """
ours = n.nvmlDeviceGetGpuInstanceById(gpu, {gi})
n.nvmlGpuInstanceDestroy(ours)
place = n.c_nvmlGpuInstancePlacement_t()
place.start, place.size = 0, 1
n.nvmlDeviceCreateGpuInstanceWithPlacement(gpu, 19, ctypes.pointer(place))
place.start, place.size = 4, 4
gi = n.nvmlDeviceCreateGpuInstanceWithPlacement(gpu, 9, ctypes.pointer(place))
n.nvmlGpuInstanceCreateComputeInstance(gi, n.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE)
"""

# Between the crash and the restart an operator cuts the partition's placement themselves.
TAKEN = """
place = n.c_nvmlGpuInstancePlacement_t()
place.start, place.size = 4, 4
gi = n.nvmlDeviceCreateGpuInstanceWithPlacement(gpu, 9, ctypes.pointer(place))
n.nvmlGpuInstanceCreateComputeInstance(gi, n.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE)
"""


@pytest.mark.parametrize(
    ("point", "operator"),
    [(PREPARE_AFTER_GPU_INSTANCE, REPLACED), (PREPARE_BEFORE_GPU_INSTANCE, TAKEN)],
    ids=["another-gpu-instance-id", "no-gpu-instance-id-recorded"],
)
def test_an_operators_instance_at_the_placement_after_a_crash_is_left_alone(
    point: str, operator: str
) -> None:
    async def body() -> None:
        async with restarted_node(LibraryNode) as here:
            await here.crash_preparing(point)
            ours = gpu_instance_ids(here.library).get((9, 4, 4), -1)
            on_library(here.library, operator.format(gi=ours))
            theirs, migs = gpu_instance_ids(here.library), read_back(here.library)["migs"]
            assert theirs[(9, 4, 4)] != ours and migs

            await here.start()  # rolls the claim back, destroying nothing of theirs
            assert gpu_instance_ids(here.library) == theirs
            assert read_back(here.library)["migs"] == migs
            log = await here.stop()
            assert "dra.mig.left_alone" in log and "dra.mig.destroyed" not in log

    asyncio.run(body())


def test_every_mig_changing_call_exists_in_pynvml() -> None:
    calls = [name for name in MigModule.__dict__ if name.startswith(("nvml", "c_nvml"))]
    assert len(calls) > 20
    assert [name for name in calls if not hasattr(pynvml, name)] == []
