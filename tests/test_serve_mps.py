"""`serve` acting on `sharing.mps` on a sim-root, as NVIDIA's plugin v0.19.0 does: replica IDs,
one control daemon per resource (the simulated `nvidia-cuda-mps-control` of the driver root)
with the reference's limits and GPUs in EXCLUSIVE_PROCESS, Allocate pointing containers at it,
a dead daemon's devices Unhealthy until it is back, and reloads applied in process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest
from harness import GPU, run, running_plugin
from test_sim_library import sim_root

from deviceplugin.model.hostpaths import mps_paths
from deviceplugin.model.mps import DaemonSpec
from deviceplugin.node.mpsdaemon import COMPUTE_MODE_DEFAULT, MpsControl, MpsDaemons, read_owner
from deviceplugin.sim.hostroot import MPS_CONTROL
from testbed.simnvml import on_library

H100_MIB = 81559  # the h100-x8 preset's GPUs
LIMITS = "deviceplugin-sim-mps.json"


def mps_config(mps_root: Path, replicas: int, extra: str = "") -> str:
    return (
        "version: v1\n"
        f"flags: {{migStrategy: none, mpsRoot: {mps_root}{extra}}}\n"
        f"sharing: {{mps: {{resources: [{{name: nvidia.com/gpu, replicas: {replicas}}}]}}}}\n"
    )


@pytest.fixture(scope="module")
def h100_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sim_root("h100-x8", tmp_path_factory.mktemp("h100"))


@pytest.fixture
def mps_root() -> Iterator[Path]:
    """Short: the daemon's socket path must fit AF_UNIX. As root on a shared mount, serve makes
    its shm a tmpfs (tests/test_mps_shm.py), which goes with the directory."""
    with tempfile.TemporaryDirectory(prefix="mps") as base:
        yield Path(base)
        for limits in Path(base).glob(f"*/*/pipe/{LIMITS}"):  # a daemon a failed test left
            os.kill(json.loads(limits.read_text())["pid"], signal.SIGKILL)
        if os.path.ismount(Path(base) / "shm"):
            subprocess.run(["umount", str(Path(base) / "shm")], check=True)


def limits(mps_root: Path) -> dict[str, Any] | None:
    path = mps_root / GPU / "pipe" / LIMITS
    return json.loads(path.read_text()) if path.exists() else None  # type: ignore[no-any-return]


def compute_mode(root: Path, index: int) -> int:
    return int(
        on_library(
            root,
            f"print(n.nvmlDeviceGetComputeMode(n.nvmlDeviceGetHandleByIndex({index})))",
        )
    )


def test_mps_shares_every_gpu_through_one_daemon_with_the_references_limits(
    h100_root: Path, mps_root: Path
) -> None:
    async def body() -> None:
        config = mps_config(mps_root, 4)
        async with running_plugin(config_text=config, driver_root=h100_root) as plugin:
            kubelet = plugin.kubelet
            assert kubelet.resources() == [GPU]
            assert kubelet.allocatable(GPU) == 32
            first = sorted(kubelet.devices(GPU))[0]
            assert first.endswith("::0")
            daemon = limits(mps_root)
            assert daemon is not None
            assert daemon["activeThreadPercentage"] == 25.0
            expected = {str(index): H100_MIB // 4 for index in range(8)}
            assert daemon["pinnedDeviceMemoryLimitMiB"] == expected
            assert compute_mode(h100_root, 0) == 3  # EXCLUSIVE_PROCESS
            log = (mps_root / GPU / "log" / "control.log").read_text()
            assert f"Cmd:set_default_device_pinned_mem_limit 0 {H100_MIB // 4}M" in log
            assert (mps_root / "shm").is_dir()

            response = (await kubelet.allocate(GPU, [[first]])).container_responses[0]
            assert response.envs["CUDA_MPS_PIPE_DIRECTORY"] == "/mps/nvidia.com/gpu/pipe"
            assert response.envs["NVIDIA_VISIBLE_DEVICES"] == first.split("::")[0]
            mounts = [(m.container_path, m.host_path) for m in response.mounts]
            assert mounts == [
                ("/mps/nvidia.com/gpu/pipe", f"{mps_root}/nvidia.com/gpu/pipe"),
                ("/dev/shm", f"{mps_root}/shm"),
            ]
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await kubelet.allocate(GPU, [sorted(kubelet.devices(GPU))[:2]])
            assert "maximum request size for shared resources is 1" in caught.value.details()
        assert limits(mps_root) is None, "the daemon quits with the plugin"
        assert compute_mode(h100_root, 0) == 0

    run(body())


def test_reloads_restart_the_daemon_only_when_its_limits_change(
    h100_root: Path, mps_root: Path
) -> None:
    async def body() -> None:
        config = mps_config(mps_root, 4)
        async with running_plugin(config_text=config, driver_root=h100_root) as plugin:
            kubelet = plugin.kubelet
            first = limits(mps_root)
            assert first is not None
            plugin.swap_config(mps_config(mps_root, 4, ", plugin: {deviceIDStrategy: index}"))
            flags = lambda: plugin.supervisor.config.flags  # noqa: E731
            await plugin.until(lambda: flags().plugin.device_id_strategy == "index")
            assert limits(mps_root) == first, "same limits: the same daemon"

            plugin.swap_config(mps_config(mps_root, 2))
            await plugin.until(lambda: kubelet.allocatable(GPU) == 16)
            second = limits(mps_root)
            assert second is not None and second["pid"] != first["pid"]
            assert second["activeThreadPercentage"] == 50.0
            assert second["pinnedDeviceMemoryLimitMiB"]["7"] == H100_MIB // 2

            plugin.swap_config("version: v1\n")
            await plugin.until(lambda: kubelet.allocatable(GPU) == 8)
            assert limits(mps_root) is None
            assert compute_mode(h100_root, 0) == 0, "compute mode restored with MPS gone"

    run(body())


def test_a_dead_daemon_makes_its_devices_unhealthy_until_it_is_back(
    tmp_path: Path, mps_root: Path
) -> None:
    root = sim_root("h100-x8", tmp_path / "root")
    program, aside = root / MPS_CONTROL, tmp_path / "aside"

    async def body() -> None:
        config = mps_config(mps_root, 2)
        async with running_plugin(
            config_text=config, driver_root=root, mps_check_seconds=0.05
        ) as plugin:
            kubelet = plugin.kubelet
            daemon = limits(mps_root)
            assert daemon is not None
            program.rename(aside)  # no restart until it is back
            os.kill(daemon["pid"], signal.SIGKILL)
            await plugin.until(lambda: kubelet.allocatable(GPU) == 0, 30)
            reasons = {d.health for d in kubelet.devices(GPU).values()}
            assert reasons == {"Unhealthy"} and len(kubelet.devices(GPU)) == 16
            aside.rename(program)
            await plugin.until(lambda: kubelet.allocatable(GPU) == 16, 30)
            back = limits(mps_root)
            assert back is not None and back["pid"] != daemon["pid"]
            assert back["activeThreadPercentage"] == 50.0

    run(body())


def test_a_driver_root_without_the_control_program_refuses_mps_and_keeps_serving(
    tmp_path: Path, mps_root: Path
) -> None:
    root = sim_root("h100-x8", tmp_path / "root")
    (root / MPS_CONTROL).unlink()

    async def body() -> None:
        async with running_plugin(config_text="version: v1\n", driver_root=root) as plugin:
            plugin.swap_config(mps_config(mps_root, 4))
            await plugin.until(lambda: plugin.supervisor.status().core.last_config_error_field)
            core = plugin.supervisor.status().core
            assert core.last_config_error_field == "flags.nvidiaDriverRoot"
            assert "nvidia-cuda-mps-control" in (core.last_config_error or "")
            assert plugin.kubelet.allocatable(GPU) == 8

    run(body())


@pytest.mark.parametrize(
    ("bad", "field", "words"),
    [
        pytest.param(
            "sharing: {mps: {resources: [{name: nvidia.com/gpu, replicas: 1}]}}",
            "sharing.mps.resources[0].replicas",
            "must be >= 2",
            id="one-replica",
        ),
        pytest.param(
            "flags: {mpsRoot: run/nvidia/mps}\n"
            "sharing: {mps: {resources: [{name: nvidia.com/gpu, replicas: 2}]}}",
            "flags.mpsRoot",
            "must be an absolute path",
            id="relative-mps-root",
        ),
    ],
)
def test_a_bad_mps_config_names_its_field_and_the_daemon_keeps_serving(
    h100_root: Path, mps_root: Path, bad: str, field: str, words: str
) -> None:
    async def body() -> None:
        async with running_plugin(
            config_text=mps_config(mps_root, 4), driver_root=h100_root
        ) as plugin:
            daemon = limits(mps_root)
            assert daemon is not None
            plugin.swap_config(f"version: v1\n{bad}\n")
            await plugin.until(lambda: plugin.supervisor.status().core.last_config_error_field)
            core = plugin.supervisor.status().core
            assert core.last_config_error_field == field
            assert words in (core.last_config_error or "")
            assert plugin.kubelet.allocatable(GPU) == 32
            assert limits(mps_root) == daemon, "the same daemon, with the same limits"

    run(body())


def test_mps_on_mig_devices_names_the_resource_and_the_last_config_keeps_serving(
    tmp_path: Path, mps_root: Path
) -> None:
    root = sim_root("a30-x4-mig", tmp_path / "root")
    single = "version: v1\nflags: {migStrategy: single}\n"

    async def body() -> None:
        async with running_plugin(config_text=single, driver_root=root) as plugin:
            before = plugin.kubelet.allocatable(GPU)
            assert before > 0
            plugin.swap_config(mps_config(mps_root, 2).replace("none", "single"))
            await plugin.until(lambda: plugin.supervisor.status().core.last_config_error_field)
            core = plugin.supervisor.status().core
            assert core.last_config_error_field == "sharing.mps.resources[0].name"
            assert "sharing using MPS is not supported for MIG devices" in (
                core.last_config_error or ""
            )
            assert plugin.kubelet.allocatable(GPU) == before
            assert limits(mps_root) is None, "no daemon for a refused config"

    run(body())


def test_a_successor_plugin_adopts_the_daemon_and_the_one_it_replaces_leaves_it(
    h100_root: Path, mps_root: Path
) -> None:
    """A rolling update overlaps two plugins on the node: the new one adopts the daemon the old
    one told the same limits, and the old one's stop neither quits it nor resets the GPUs."""
    pipe, log, shm = mps_paths(str(mps_root), GPU)
    spec = DaemonSpec(GPU, pipe, log, shm, ("GPU-x",), 25, (("0", "20389M"),))
    control = MpsControl(h100_root / MPS_CONTROL)
    modes: dict[str, list[tuple[str, int]]] = {"old": [], "new": [], "third": []}

    def recorder(name: str) -> Any:
        async def set_mode(uuid: str, mode: int) -> None:
            modes[name].append((uuid, mode))

        return set_mode

    async def body() -> None:
        old, new = MpsDaemons(recorder("old")), MpsDaemons(recorder("new"))
        await old.apply({GPU: spec}, control)
        first = limits(mps_root)
        assert first is not None and first["activeThreadPercentage"] == 25
        await new.apply({GPU: spec}, control)
        assert limits(mps_root) == first  # adopted: the same daemon, not restarted
        assert read_owner(spec) == {"owner": new.owner, "commands": list(spec.commands())}
        await old.stop_all()
        assert await control.healthy(spec) and limits(mps_root) == first
        assert ("GPU-x", COMPUTE_MODE_DEFAULT) not in modes["old"]
        # a successor with other limits restarts the daemon rather than adopt it
        third = MpsDaemons(recorder("third"))
        await third.apply({GPU: replace(spec, thread_percentage=50)}, control)
        restarted = limits(mps_root)
        assert restarted is not None and restarted["pid"] != first["pid"]
        assert restarted["activeThreadPercentage"] == 50
        await new.stop_all()  # handed over: the third plugin's daemon keeps serving
        assert await control.healthy(spec)
        await third.stop_all()
        assert limits(mps_root) is None and read_owner(spec) is None
        assert modes["third"][-1] == ("GPU-x", COMPUTE_MODE_DEFAULT)

    run(body())
