"""MPS in the DRA driver, over the real DRA socket on the simulated libnvidia-ml.so.1 and the
simulated `nvidia-cuda-mps-control` of the driver root: NVIDIA's `GpuConfig` with
`sharing.strategy: MPS` starts one control daemon per GPU, shared by every claim on it, with the
GPU in EXCLUSIVE_PROCESS; each claim's CDI device points its containers at the daemon with the
claim's own limits; the last Unprepare stops the daemon and restores the compute mode; a
restarted driver reattaches to a live daemon, starts a dead one again and stops one that no
claim records, and a running one starts a daemon that died again at its periodic check; bad MPS
configs are refused at Prepare, naming the field."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from deviceplugin.dra.checkpoint import FILE_NAME
from deviceplugin.model.memoryshares import GpuSharing
from deviceplugin.model.slices import device_name
from deviceplugin.node.mpsshm import release_shm
from deviceplugin.sim.hostroot import MPS_CONTROL, install_mps_control
from deviceplugin.sim.libbuild import mps_control_path
from testbed.simnvml import on_library
from tests.dranode import inventory
from tests.draplugin import DRIVER, PRESET, Node, claim, resolve, run, running_driver

FOUND = inventory(PRESET)
WHOLE_GPUS = [gpu for gpu in FOUND.gpus if not gpu.mig_enabled]
GPU, OTHER = WHOLE_GPUS[0], WHOLE_GPUS[1]
MIG_GPU = next(gpu for gpu in FOUND.gpus if gpu.mig_enabled)
MIG = device_name(MIG_GPU, MIG_GPU.mig_devices[0])
WHOLE, OTHER_NAME = device_name(GPU, None), device_name(OTHER, None)
SHARES = ("5f0c2a8e-1b3d-4e6f-8a9b-0c1d2e3f4a5b", "6a1d3b9f-2c4e-4f70-9bac-1d2e3f4a5b6c")
EXCLUSIVE_PROCESS, DEFAULT = 3, 0
CONFIG = "status.allocation.devices.config[0].opaque.parameters"


def mps(kind: str = "GpuConfig", **sharing: Any) -> dict[str, Any]:
    return {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": kind,
        "sharing": {"strategy": "MPS", **sharing},
    }


def claim_of(
    name: str,
    parameters: dict[str, Any] | None,
    device: str = WHOLE,
    share: str = "",
    memory: str = "",
    more: tuple[str, ...] = (),
    namespace: str = "default",
) -> dict[str, Any]:
    """A claim of `namespace` allocated `device` (and `more`), with `parameters` as its opaque
    config; a share of the device with `share` (and `memory`)."""
    body = claim(name, [("gpu", device), *(("gpu", d) for d in more)], namespace=namespace)
    allocated = body["status"]["allocation"]["devices"]
    if share:
        allocated["results"][0]["shareID"] = share
    if memory:
        allocated["results"][0]["consumedCapacity"] = {"memory": memory}
    if parameters is not None:
        opaque = {"driver": DRIVER, "parameters": parameters}
        allocated["config"] = [{"source": "FromClaim", "requests": [], "opaque": opaque}]
    return body


def driver_root(node: Node) -> Path:
    return Path(node.settings.overrides["nvidia_driver_root"] or "")


@contextlib.asynccontextmanager
async def mps_driver(
    gpu_sharing: GpuSharing = "off", shared_namespaces: tuple[tuple[str, ...], ...] = ()
) -> AsyncIterator[Node]:
    """The driver on the simulated library, with the simulated control program installed where
    `sim-root` puts it; the daemons a failed test left are killed (they outlive the driver by
    design) and their shm tmpfs unmounted (as root the driver mounts one)."""
    async with running_driver(
        gpu_sharing=gpu_sharing, library=True, mps_shared_namespaces=shared_namespaces
    ) as node:
        install_mps_control(driver_root(node), mps_control_path())
        homes = node.kubelet_root / "plugins" / DRIVER / "mps"
        try:
            yield node
        finally:
            for pid in homes.glob("*/pipe/*.pid"):
                with contextlib.suppress(OSError, ValueError):
                    os.kill(int(pid.read_text()), signal.SIGKILL)
            for shm in homes.glob("*/shm"):
                release_shm(str(shm))


def home(node: Node, device: str) -> Path:
    return node.kubelet_root / "plugins" / DRIVER / "mps" / device


def control(node: Node, device: str, command: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The driver root's control program on `device`'s daemon, as an operator runs it."""
    env = {
        "CUDA_MPS_PIPE_DIRECTORY": str(home(node, device) / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(home(node, device) / "log"),
    }
    return subprocess.run(
        [str(driver_root(node) / MPS_CONTROL), *args],
        input=command,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def answers(node: Node, device: str) -> bool:
    return control(node, device, "get_default_active_thread_percentage").returncode == 0


def compute_mode(node: Node, gpu_index: int) -> int:
    line = f"print(n.nvmlDeviceGetComputeMode(n.nvmlDeviceGetHandleByIndex({gpu_index})))"
    return int(on_library(driver_root(node), line))


def recorded(node: Node) -> dict[str, dict[str, Any]]:
    """Claim UID -> the MPS daemon its checkpoint entry records."""
    document = json.loads((node.kubelet_root / "plugins" / DRIVER / FILE_NAME).read_text())
    return {
        uid: device["mpsDaemon"]
        for uid, entry in document["data"]["claims"].items()
        for device in entry["devices"]
        if "mpsDaemon" in device
    }


def pid_file(node: Node, device: str) -> int:
    return int((home(node, device) / "pipe" / "nvidia-cuda-mps-control.pid").read_text())


async def prepared(node: Node, *bodies: dict[str, Any]) -> list[tuple[str, str, str]]:
    refs = [node.add_claim(body) for body in bodies]
    done = await node.watcher.prepare(DRIVER, refs)
    for ref in refs:
        assert done.claims[ref[2]].error == "", done.claims[ref[2]].error
    return refs


def edits(node: Node, ref: tuple[str, str, str]) -> dict[str, Any]:
    (device,) = node.watcher.prepared[(DRIVER, ref[2])]
    return resolve(node.cdi_dir, device.cdi_device_ids[0])


def test_two_claims_on_one_gpu_share_one_daemon_until_the_last_unprepare() -> None:
    async def body() -> None:
        async with mps_driver("memory") as node:
            first, second = await prepared(
                node,
                claim_of(
                    "first",
                    mps(
                        mpsConfig={
                            "defaultActiveThreadPercentage": 30,
                            "defaultPinnedDeviceMemoryLimit": "10Gi",
                        }
                    ),
                    share=SHARES[0],
                    memory="20Gi",
                ),
                claim_of(
                    "second",
                    mps(mpsConfig={"defaultPerDevicePinnedMemoryLimit": {GPU.uuid: "4Gi"}}),
                    share=SHARES[1],
                    memory="30Gi",
                ),
            )
            daemons = recorded(node)
            assert daemons[first[2]] == daemons[second[2]]
            pipe = str(home(node, WHOLE) / "pipe")
            assert daemons[first[2]] == {
                "uuid": GPU.uuid,
                "pipeDir": pipe,
                "pid": pid_file(node, WHOLE),
            }
            assert answers(node, WHOLE)
            assert compute_mode(node, GPU.index) == EXCLUSIVE_PROCESS

            one, two = edits(node, first), edits(node, second)
            for got in (one, two):
                assert "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps" in got["env"]
                mounts = {m["containerPath"]: m["hostPath"] for m in got["mounts"]}
                assert mounts["/tmp/nvidia-mps"] == pipe
                assert mounts["/dev/shm"] == str(home(node, WHOLE) / "shm")
            assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30" in one["env"]
            assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M" in one["env"]
            assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M" in two["env"]
            assert not any(e.startswith("CUDA_MPS_ACTIVE_THREAD") for e in two["env"])

            assert (await node.watcher.unprepare(DRIVER, [first])).claims[first[2]].error == ""
            assert answers(node, WHOLE)
            assert compute_mode(node, GPU.index) == EXCLUSIVE_PROCESS
            assert (await node.watcher.unprepare(DRIVER, [second])).claims[second[2]].error == ""
            assert not answers(node, WHOLE)
            assert not home(node, WHOLE).exists()
            assert compute_mode(node, GPU.index) == DEFAULT

    run(body)


def test_a_mig_device_gets_a_daemon_of_its_own() -> None:
    async def body() -> None:
        async with mps_driver() as node:
            (ref,) = await prepared(node, claim_of("mig", mps("MigDeviceConfig"), device=MIG))
            assert recorded(node)[ref[2]]["uuid"] == MIG_GPU.mig_devices[0].uuid
            assert answers(node, MIG)
            await node.watcher.unprepare(DRIVER, [ref])
            assert not answers(node, MIG)

    run(body)


def test_a_restart_reattaches_a_live_daemon_restarts_a_dead_one_and_stops_an_orphan() -> None:
    async def body() -> None:
        async with mps_driver() as node:
            (ref,) = await prepared(node, claim_of("kept", mps()))
            pid = recorded(node)[ref[2]]["pid"]
            await node.restart()
            assert recorded(node)[ref[2]]["pid"] == pid  # reattached
            assert answers(node, WHOLE)

            os.kill(pid, signal.SIGKILL)
            while answers(node, WHOLE):  # the killed process may take a moment to go
                pass
            # an orphan: a daemon under the driver's homes that no claim records
            orphan = home(node, OTHER_NAME)
            assert control(node, OTHER_NAME, "", "-d").returncode == 0
            on_library(
                driver_root(node),
                f"n.nvmlDeviceSetComputeMode(n.nvmlDeviceGetHandleByIndex({OTHER.index}), 3)",
            )
            await node.restart()
            again = recorded(node)[ref[2]]["pid"]
            assert again not in (0, pid)
            assert again == pid_file(node, WHOLE)
            assert answers(node, WHOLE)
            assert not answers(node, OTHER_NAME)
            assert not orphan.exists()
            assert compute_mode(node, OTHER.index) == DEFAULT
            await node.watcher.unprepare(DRIVER, [ref])
            assert not answers(node, WHOLE)

    run(body)


# (claim, what its error says, case)
BAD_INPUTS: list[tuple[dict[str, Any], str, str]] = [
    (
        claim_of("pct", mps(mpsConfig={"defaultActiveThreadPercentage": 150})),
        f"{CONFIG}.sharing.mpsConfig.defaultActiveThreadPercentage: must be between 1 and 100",
        "thread-percentage-above-100",
    ),
    (
        claim_of("zero", mps(mpsConfig={"defaultActiveThreadPercentage": 0})),
        f"{CONFIG}.sharing.mpsConfig.defaultActiveThreadPercentage: must be between 1 and 100",
        "thread-percentage-zero",
    ),
    (
        claim_of("big", mps(mpsConfig={"defaultPinnedDeviceMemoryLimit": "100Gi"})),
        f"{CONFIG}.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: 102400 MiB is more than"
        f" the memory of {WHOLE}",
        "pinned-limit-above-the-gpu",
    ),
    (
        claim_of(
            "share",
            mps(mpsConfig={"defaultPinnedDeviceMemoryLimit": "30Gi"}),
            share=SHARES[0],
            memory="20Gi",
        ),
        f"{CONFIG}.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: 30720 MiB is more than"
        f" the claim's memory share of {WHOLE}",
        "pinned-limit-above-the-share",
    ),
    (
        claim_of("tiny", mps(mpsConfig={"defaultPinnedDeviceMemoryLimit": "1Ki"})),
        f"{CONFIG}.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: must be at least 1Mi",
        "pinned-limit-below-a-mib",
    ),
    (
        claim_of("index", mps(mpsConfig={"defaultPerDevicePinnedMemoryLimit": {"1": "1Gi"}})),
        f"{CONFIG}.sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[1]: names no device",
        "per-device-limit-of-another-device",
    ),
    (
        claim_of("both", mps(timeSlicingConfig={"interval": "Short"})),
        f"{CONFIG}.sharing.timeSlicingConfig: cannot be used with the 'MPS' strategy",
        "mps-with-time-slicing-config",
    ),
    (
        claim_of(
            "ts",
            {
                "apiVersion": "resource.nvidia.com/v1beta1",
                "kind": "GpuConfig",
                "sharing": {"strategy": "TimeSlicing", "mpsConfig": {}},
            },
        ),
        f"{CONFIG}.sharing.mpsConfig: cannot be used with the 'TimeSlicing' strategy",
        "time-slicing-with-mps-config",
    ),
    (
        claim_of("typo", mps(mpsConfig={"defaultActiveThreadPercent": 50})),
        f"{CONFIG}.sharing.mpsConfig.defaultActiveThreadPercent: is not a field of this API",
        "unknown-field",
    ),
    (
        claim_of("two", mps(), more=(OTHER_NAME,)),
        f"status.allocation.devices.results[1]: {OTHER_NAME} asks for MPS as {WHOLE} does",
        "two-mps-devices-in-one-claim",
    ),
]


def test_a_daemon_that_dies_while_the_driver_runs_is_started_again_by_its_check() -> None:
    async def body() -> None:
        async with mps_driver() as node:
            (ref,) = await prepared(node, claim_of("revived", mps()))
            pid = recorded(node)[ref[2]]["pid"]
            await node.driver.check_node()
            assert recorded(node)[ref[2]]["pid"] == pid  # one that answers is left alone

            os.kill(pid, signal.SIGKILL)
            while answers(node, WHOLE):  # the killed process may take a moment to go
                pass
            await node.driver.check_node()
            again = recorded(node)[ref[2]]["pid"]
            assert again not in (0, pid)
            assert again == pid_file(node, WHOLE)
            assert answers(node, WHOLE)
            assert compute_mode(node, GPU.index) == EXCLUSIVE_PROCESS
            await node.watcher.unprepare(DRIVER, [ref])
            assert not home(node, WHOLE).exists()
            assert compute_mode(node, GPU.index) == DEFAULT

    run(body)


def test_bad_mps_configs_are_refused_at_prepare_naming_the_field() -> None:
    async def body() -> None:
        async with mps_driver("memory") as node:
            for claim_body, error, case in BAD_INPUTS:
                ref = node.add_claim(claim_body)
                done = await node.watcher.prepare(DRIVER, [ref])
                got = done.claims[ref[2]].error
                assert error in got, f"{case}: {got}"
            assert list(node.cdi_dir.glob("*.json")) == []
            assert not (node.kubelet_root / "plugins" / DRIVER / "mps").exists()

    run(body)


def test_mps_and_no_mps_on_one_gpu_and_a_missing_control_program_are_refused() -> None:
    async def body() -> None:
        async with mps_driver("memory") as node:
            (held,) = await prepared(node, claim_of("mps", mps(), share=SHARES[0], memory="8Gi"))
            plain = node.add_claim(claim_of("plain", None, share=SHARES[1], memory="8Gi"))
            error = (await node.watcher.prepare(DRIVER, [plain])).claims[plain[2]].error
            assert "no config asks for MPS, but the device runs an MPS control daemon" in error
            await node.watcher.unprepare(DRIVER, [held])

            (driver_root(node) / MPS_CONTROL).unlink()
            ref = node.add_claim(claim_of("nobin", mps()))
            error = (await node.watcher.prepare(DRIVER, [ref])).claims[ref[2]].error
            assert (
                f"{CONFIG[: -len('.opaque.parameters')]}.opaque.parameters.sharing.strategy"
                in error
            )
            assert "has no executable usr/bin/nvidia-cuda-mps-control" in error

    run(body)
