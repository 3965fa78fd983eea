"""The CDI spec: the pure builder, the host scan and writer at the edge, and `serve` keeping the
spec in step with the inventory and the config over the real kubelet socket."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from deviceplugin.model.cdi import (
    CdiError,
    CdiOptions,
    HostScan,
    build_spec,
    common_edits,
    minimum_cdi_version,
)
from deviceplugin.model.config import Config, load_config_text
from deviceplugin.model.devices import Inventory
from deviceplugin.model.hostpaths import SIM_ROOT_MARKER, capability_node, host_path
from deviceplugin.node.cdiwriter import SpecWriter
from deviceplugin.node.discovery import discover, sysfs_numa_reader
from deviceplugin.node.hostscan import scan_host
from deviceplugin.node.simmarker import is_sim_root
from deviceplugin.plugin.cdispec import node_spec
from deviceplugin.runtime import engine
from deviceplugin.sim.hostroot import (
    CAPS_MAJOR,
    LIBRARY_NODE_FILE,
    NVIDIA_MAJOR,
    gpu_instance_minor,
    lay_out,
    mig_minors_table,
)
from deviceplugin.sim.kubelet import KubeletEmulator
from deviceplugin.sim.node import read_node, resolve_node_path
from deviceplugin.sim.simulator import NodeSimulator
from deviceplugin.wire.deviceplugin.v1beta1 import api_pb2
from tests.harness import GPU, MIG, SEED, Plugin, run, running_plugin

PRESET = "a100-80gb-x8-mixed"
KIND = "k8s.device-plugin.nvidia.com/gpu"
CDI_CRI = {"DEVICE_LIST_STRATEGY": "cdi-cri"}
AS_ROOT = os.geteuid() == 0


def inventory_of(preset: str = PRESET) -> Inventory:
    nvml = NodeSimulator(preset).open_nvml(None)
    nvml.init()
    try:
        return discover(nvml)
    finally:
        nvml.shutdown()


def config_with(**flags: Any) -> Config:
    text = yaml.safe_dump({"version": "v1", "flags": {"migStrategy": "mixed", **flags}})
    return load_config_text(text, None, {}, {}).config


@pytest.fixture
def host_root(tmp_path: Path) -> Path:
    root = tmp_path / "host"
    lay_out(read_node(resolve_node_path(PRESET)), root)
    return root


def spec_devices(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {device["name"]: device for device in spec["devices"]}


def node_paths(device: dict[str, Any]) -> list[str]:
    return [node["path"] for node in device["containerEdits"]["deviceNodes"]]


# --- the pure builder ---------------------------------------------------------------------------


def test_every_gpu_and_mig_device_is_defined_under_its_allocate_name(host_root: Path) -> None:
    inventory = inventory_of()
    root = str(host_root)
    config = config_with(nvidiaDriverRoot=root)
    spec = node_spec(inventory, config, host_path(root, "/proc"))
    devices = spec_devices(spec)
    expected = {"all"}
    for gpu in inventory.gpus:
        expected.add(gpu.uuid)
        expected.update(mig.uuid for mig in gpu.mig_devices)
    assert set(devices) == expected
    assert spec["kind"] == KIND
    assert spec["cdiVersion"] == "0.5.0"  # hostPath on device nodes; podman 4.3 skips >= 0.6.0
    for gpu in inventory.gpus:
        whole = devices[gpu.uuid]["containerEdits"]["deviceNodes"]
        assert whole == [
            {
                "path": f"/dev/nvidia{gpu.minor}",
                "hostPath": f"{root}/dev/nvidia{gpu.minor}",
                **({"type": "c", "major": NVIDIA_MAJOR, "minor": gpu.minor} if AS_ROOT else {}),
            }
        ]
        for mig in gpu.mig_devices:
            gi_minor = gpu_instance_minor(gpu.minor, mig.gpu_instance_id)
            ci_minor = gi_minor + 1 + mig.compute_instance_id
            assert node_paths(devices[mig.uuid]) == [
                f"/dev/nvidia{gpu.minor}",
                capability_node(gi_minor),
                capability_node(ci_minor),
            ]
            caps = devices[mig.uuid]["containerEdits"]["deviceNodes"][1:]
            assert all(node["major"] == CAPS_MAJOR for node in caps)  # from proc/devices
            assert all(node["hostPath"].startswith(f"{root}/dev/nvidia-caps/") for node in caps)
    every = {
        path for name, device in devices.items() if name != "all" for path in node_paths(device)
    }
    assert set(node_paths(devices["all"])) == every


def test_index_names_and_common_edits_are_host_paths(host_root: Path) -> None:
    inventory = inventory_of()
    root = str(host_root)
    config = config_with(nvidiaDriverRoot=root, plugin={"deviceIDStrategy": "index"})
    spec = node_spec(inventory, config, host_path(root, "/proc"))
    names = set(spec_devices(spec)) - {"all"}
    expected = {str(g.index) for g in inventory.gpus} | {
        f"{g.index}:{m.index}" for g in inventory.gpus for m in g.mig_devices
    }
    assert names == expected
    edits = spec["containerEdits"]
    assert edits["env"] == ["NVIDIA_VISIBLE_DEVICES=void"]
    assert {n["path"] for n in edits["deviceNodes"]} >= {"/dev/nvidiactl", "/dev/nvidia-uvm"}
    mounts = {m["containerPath"]: m for m in edits["mounts"]}
    version = inventory.driver_version
    library = f"/usr/lib/x86_64-linux-gnu/libcuda.so.{version}"
    assert mounts[library]["hostPath"] == root + library
    assert "/usr/lib/x86_64-linux-gnu/libcuda.so.1" in mounts  # the soname link too
    assert mounts["/usr/bin/nvidia-smi"]["hostPath"] == f"{root}/usr/bin/nvidia-smi"
    assert mounts.pop("/var/run/nvidia-container-devices/void") == {
        "hostPath": "/dev/null",  # the opt-out of a legacy runtime reading volume mounts
        "containerPath": "/var/run/nvidia-container-devices/void",
        "options": ["ro", "nosuid", "nodev", "bind"],
    }
    assert all("ro" in m["options"] and m["hostPath"].startswith(root) for m in mounts.values())


def test_a_missing_mig_minors_entry_names_the_device(host_root: Path) -> None:
    inventory = inventory_of()
    scan = scan_host(inventory.driver_version, str(host_root), str(host_root), "/nonexistent")
    gpu = next(g for g in inventory.gpus if g.mig_devices)
    with pytest.raises(CdiError, match=gpu.mig_devices[0].uuid):
        build_spec(inventory, scan, CdiOptions(driver_root=str(host_root)))


def test_the_version_is_the_minimum_the_spec_needs() -> None:
    assert minimum_cdi_version({"devices": []}) == "0.3.0"
    node = {"path": "/dev/nvidia0", "hostPath": "/dev/nvidia0"}
    assert (
        minimum_cdi_version({"devices": [{"containerEdits": {"deviceNodes": [node]}}]}) == "0.5.0"
    )
    assert minimum_cdi_version({"annotations": {"a": "b"}, "devices": []}) == "0.6.0"
    mount = {"hostPath": "/a", "containerPath": "/a", "type": "bind"}
    assert minimum_cdi_version({"containerEdits": {"mounts": [mount]}}) == "0.4.0"


def test_the_spec_of_an_empty_inventory_defines_nothing() -> None:
    spec = build_spec(Inventory(gpus=()), HostScan(), CdiOptions())
    assert spec["devices"] == []


# --- the host scan and the writer ---------------------------------------------------------------


@pytest.mark.skipif(not AS_ROOT, reason="character devices need root")
def test_a_laid_out_host_has_real_character_devices(host_root: Path) -> None:
    info = os.stat(host_root / "dev/nvidia3")
    assert stat.S_ISCHR(info.st_mode)
    assert (os.major(info.st_rdev), os.minor(info.st_rdev)) == (NVIDIA_MAJOR, 3)
    text = (host_root / "proc/driver/nvidia-caps/mig-minors").read_text()
    assert len(text.splitlines()) == len(mig_minors_table()) == 2 + 32 * 15 * 9
    assert "gpu0/gi1/access 12\n" in text and "gpu0/gi1/ci0/access 13\n" in text


def test_a_temporary_tree_lists_its_own_gpus_in_mig_minors(tmp_path: Path) -> None:
    node = read_node(resolve_node_path(PRESET))
    lay_out(node, tmp_path, every_instance=False)
    text = (tmp_path / "proc/driver/nvidia-caps/mig-minors").read_text()
    rows = dict(line.split() for line in text.splitlines())
    whole = mig_minors_table()
    assert {key.split("/")[0] for key in rows} == {"config", "monitor"} | {
        f"gpu{gpu.minor}" for gpu in node.gpus
    }
    assert all(whole[key] == int(minor) for key, minor in rows.items())
    assert len(rows) == 2 + len(node.gpus) * 15 * 9


def test_the_scan_reads_majors_nodes_and_files(host_root: Path) -> None:
    inventory = inventory_of()
    root = str(host_root)
    scan = scan_host(inventory.driver_version, root, root, f"{root}/proc")
    assert scan.majors["nvidia-caps"] == CAPS_MAJOR
    assert scan.mig_minors["gpu2/gi3/ci0/access"] == gpu_instance_minor(2, 3) + 1
    ctl = next(node for node in scan.control_nodes if node.path == "/dev/nvidiactl")
    assert (ctl.major, ctl.minor) == ((NVIDIA_MAJOR, 255) if AS_ROOT else (None, None))
    assert any(
        path.endswith(f"libnvidia-ml.so.{inventory.driver_version}") for path in scan.libraries
    )
    empty = scan_host(inventory.driver_version, "/nonexistent", "/nonexistent", "/nonexistent")
    assert empty == HostScan(driver_version=inventory.driver_version)


def test_a_simulated_roots_library_finds_its_node_and_state_in_the_container(
    host_root: Path,
) -> None:
    inventory = inventory_of()
    root = str(host_root)
    (host_root / LIBRARY_NODE_FILE).write_text("{}")
    scan = scan_host(inventory.driver_version, root, root, f"{root}/proc")
    node_file = "/usr/lib/x86_64-linux-gnu/deviceplugin-sim-node.json"
    assert scan.simulation == (node_file, "/etc/deviceplugin-sim")
    mounts = {
        m["containerPath"]: m for m in common_edits(scan, CdiOptions(driver_root=root))["mounts"]
    }
    for path in scan.simulation:  # read-only: the library only reads state in a container
        assert mounts[path] == {
            "hostPath": root + path,
            "containerPath": path,
            "options": ["ro", "nosuid", "nodev", "rbind", "rprivate"],
        }
    (host_root / SIM_ROOT_MARKER).unlink()  # a real driver root has no such files to mount
    unmarked = scan_host(inventory.driver_version, root, root, f"{root}/proc")
    assert unmarked.simulation == ()


def test_the_writer_is_atomic_leaves_nothing_behind_and_skips_unchanged(tmp_path: Path) -> None:
    writer = SpecWriter(tmp_path / "cdi" / "spec.json")
    spec = {"cdiVersion": "0.3.0", "kind": KIND, "devices": []}
    assert writer.write(spec) is True
    assert stat.S_IMODE(writer.path.stat().st_mode) == 0o644
    assert json.loads(writer.path.read_text()) == spec
    inode = writer.path.stat().st_ino
    assert writer.write(spec) is False
    assert writer.path.stat().st_ino == inode  # not replaced
    assert writer.write({**spec, "devices": [{"name": "x"}]}) is True
    assert writer.path.stat().st_ino != inode  # replaced by rename, never edited in place
    assert os.listdir(writer.path.parent) == ["spec.json"]
    assert writer.remove() is True
    assert writer.remove() is False


def test_a_failed_write_raises_and_leaves_no_temp_file(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(NotADirectoryError):
        SpecWriter(blocker / "cdi" / "spec.json").write({"devices": []})
    directory = tmp_path / "full"
    directory.mkdir()
    writer = SpecWriter(directory / "spec.json")
    real_replace = os.replace

    def failing_replace(*args: Any) -> None:
        raise OSError(28, "No space left on device")

    os.replace = failing_replace  # type: ignore[assignment]
    try:
        with pytest.raises(OSError, match="No space"):
            writer.write({"devices": []})
    finally:
        os.replace = real_replace
    assert os.listdir(directory) == []


# --- serve ------------------------------------------------------------------------------------


class SpecCheckingKubelet(KubeletEmulator):
    """Records, at each registration, whether the plugin's CDI spec already exists."""

    spec: Path | None = None
    spec_at_register: list[bool]

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.spec = directory.parent / "cdi" / "k8s.device-plugin.nvidia.com-gpu.json"
        self.spec_at_register = []

    async def Register(self, request: Any, context: Any) -> Any:
        assert self.spec is not None
        self.spec_at_register.append(self.spec.exists())
        return await super().Register(request, context)


def advertised(plugin: Plugin, resource: str) -> list[str]:
    return sorted(plugin.kubelet.devices(resource))


async def cdi_names(plugin: Plugin, resource: str, device_id: str) -> list[str]:
    response = await plugin.kubelet.allocate(resource, [[device_id]])
    return [device.name for device in response.container_responses[0].cdi_devices]


def read_spec(plugin: Plugin) -> dict[str, Any]:
    spec: dict[str, Any] = json.loads(plugin.cdi_spec.read_text())
    return spec


def test_serve_writes_the_spec_before_registering_and_defines_every_allocated_name() -> None:
    async def body() -> None:
        async with running_plugin(env=CDI_CRI, kubelet_type=SpecCheckingKubelet) as plugin:
            kubelet = plugin.kubelet
            assert isinstance(kubelet, SpecCheckingKubelet)
            assert kubelet.spec_at_register and all(kubelet.spec_at_register)
            spec = read_spec(plugin)
            defined = {f"{KIND}={name}" for name in spec_devices(spec)}
            by_physical: dict[str, set[str]] = {}
            for resource in (GPU, MIG):
                ids = advertised(plugin, resource)
                assert ids
                for device_id in ids:
                    names = await cdi_names(plugin, resource, device_id)
                    assert len(names) == 1 and names[0] in defined, (device_id, names)
                    by_physical.setdefault(names[0], set()).add(device_id)
            # the two replicas of a GPU resolve to that GPU's one CDI device
            assert sorted(len(ids) for ids in by_physical.values()) == [1] * 28 + [2] * 4
            assert stat.S_IMODE(plugin.cdi_spec.stat().st_mode) == 0o644

    run(body())


def test_index_ids_name_index_devices() -> None:
    async def body() -> None:
        env = {**CDI_CRI, "DEVICE_ID_STRATEGY": "index"}
        async with running_plugin(env=env) as plugin:
            defined = set(spec_devices(read_spec(plugin)))
            mig_id = advertised(plugin, MIG)[0]
            (name,) = await cdi_names(plugin, MIG, mig_id)
            index = name.removeprefix(f"{KIND}=")
            assert ":" in index and index in defined
            (gpu_name,) = await cdi_names(plugin, GPU, advertised(plugin, GPU)[0])
            assert gpu_name.removeprefix(f"{KIND}=").isdigit()

    run(body())


def test_reloads_rewrite_the_spec_only_when_it_changes_and_remove_it_without_cdi() -> None:
    async def body() -> None:
        base = yaml.safe_load(SEED.format(replicas=2))

        def config(**plugin_flags: Any) -> str:
            flags = {**base["flags"], "plugin": plugin_flags}
            return yaml.safe_dump({**base, "flags": flags})

        async with running_plugin(config_text=config(deviceListStrategy=["cdi-cri"])) as plugin:
            sup = plugin.supervisor
            first = plugin.cdi_spec.stat().st_ino
            assert await sup.reload("test", force=True)  # same CDI options: not rewritten
            assert plugin.cdi_spec.stat().st_ino == first
            plugin.swap_config(config(deviceListStrategy=["cdi-cri"], deviceIDStrategy="index"))
            await plugin.until(lambda: "0" in spec_devices(read_spec(plugin)))
            assert plugin.cdi_spec.stat().st_ino != first
            plugin.swap_config(config(deviceListStrategy=["envvar"]))
            await plugin.until(lambda: not plugin.cdi_spec.exists())
            plugin.swap_config(config(deviceListStrategy=["cdi-annotations"]))
            await plugin.until(plugin.cdi_spec.exists)
            response = await plugin.kubelet.allocate(GPU, [[advertised(plugin, GPU)[0]]])
            (value,) = response.container_responses[0].annotations.values()
            assert value.removeprefix(f"{KIND}=") in spec_devices(read_spec(plugin))

    run(body())


def test_an_unhealthy_device_stays_defined() -> None:
    async def body() -> None:
        async with running_plugin(env=CDI_CRI) as plugin:
            before = plugin.cdi_spec.read_bytes()
            uuid = next(iter(plugin.kubelet.devices(MIG)))
            mig_uuid = plugin.supervisor._planned[MIG].by_id()[uuid].physical_uuid
            plugin.event(uuid=mig_uuid, xid=48)
            await plugin.until(lambda: not plugin.kubelet.devices(MIG)[uuid].healthy)
            assert plugin.cdi_spec.read_bytes() == before

    run(body())


def test_a_failed_write_makes_readyz_not_ready_and_is_retried(
    monkeypatch: Any, tmp_path: Path
) -> None:
    monkeypatch.setattr(engine, "SOCKET_CHECK_SECONDS", 0.05)
    blocker = tmp_path / "file"  # a file where the spec's directory must be
    blocker.write_text("")
    spec = blocker / "cdi" / "k8s.device-plugin.nvidia.com-gpu.json"

    async def body() -> None:
        async with running_plugin(
            env=CDI_CRI, wait_registered=False, cdi_spec_dir=blocker / "cdi"
        ) as plugin:
            # the plugin registers and serves while the spec cannot be written
            await plugin.until(lambda: set(plugin.kubelet.resources()) == {GPU, MIG}, 10)
            status = plugin.supervisor.status()
            assert status.cdi_spec_error is not None
            assert "ENOTDIR" in status.cdi_spec_error and str(spec) in status.cdi_spec_error
            assert any("CDI spec not written" in r for r in status.not_ready)
            assert not status.ready
            blocker.unlink()
            await plugin.until(lambda: plugin.supervisor.status().cdi_spec_error is None)
            assert spec.exists() and plugin.supervisor.status().ready

    run(body())


def test_pass_device_specs_answers_a_mig_id_with_its_parent_and_both_caps_nodes() -> None:
    async def body() -> None:
        env = {"PASS_DEVICE_SPECS": "true"}
        async with running_plugin(env=env) as plugin:
            host = plugin.supervisor.engine.host
            assert host is not None and host.temporary
            root = host.root
            device_id = advertised(plugin, MIG)[0]
            device = plugin.supervisor._planned[MIG].by_id()[device_id]
            inventory = plugin.supervisor.engine.inventory
            assert inventory is not None
            gpu = next(g for g in inventory.gpus if g.uuid == device.gpu_uuid)
            mig = next(m for m in gpu.mig_devices if m.uuid == device.physical_uuid)
            response = await plugin.kubelet.allocate(MIG, [[device_id]])
            specs = response.container_responses[0].devices
            gi = gpu_instance_minor(gpu.minor, mig.gpu_instance_id)
            paths = [s.container_path for s in specs]
            assert f"/dev/nvidia{gpu.minor}" in paths
            assert capability_node(gi) in paths
            assert capability_node(gi + 1 + mig.compute_instance_id) in paths
            assert all(s.host_path.startswith(root) and os.path.exists(s.host_path) for s in specs)
        assert not os.path.exists(root)  # the temporary host is removed on exit

    run(body())


def test_a_user_given_driver_root_stands_for_the_whole_host(tmp_path: Path) -> None:
    root = Path(tmp_path) / "sim"
    lay_out(read_node(resolve_node_path(PRESET)), root)
    (root / "proc/driver/nvidia-caps/mig-minors").write_text("")  # a host without the table

    async def body() -> None:
        env = {"PASS_DEVICE_SPECS": "true", "NVIDIA_DRIVER_ROOT": str(root)}
        async with running_plugin(env=env) as plugin:
            device_id = advertised(plugin, MIG)[0]
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await plugin.kubelet.allocate(MIG, [[device_id]])
            assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "mig-minors" in (raised.value.details() or "")
        assert root.exists()  # a tree the user gave is left alone

    run(body())


# --- the commands -----------------------------------------------------------------------------


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "deviceplugin", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_cdi_spec_prints_what_serve_writes(host_root: Path) -> None:
    args = ("--simulate", PRESET, "--nvidia-driver-root", str(host_root))
    printed = cli("cdi-spec", "-o", "yaml", "--device-list-strategy", "cdi-cri", *args)
    assert printed.returncode == 0, printed.stderr
    spec = yaml.safe_load(printed.stdout)
    assert "&id" not in printed.stdout  # shared nodes written out, not as anchors
    config = config_with(nvidiaDriverRoot=str(host_root))
    assert spec == node_spec(inventory_of(), config, f"{host_root}/proc")
    unconfigured = cli("cdi-spec", *args)
    assert unconfigured.returncode == 0
    assert json.loads(unconfigured.stdout) == spec
    assert "no CDI strategy" in unconfigured.stderr


def test_sim_root_writes_a_tree_serve_can_use(tmp_path: Path) -> None:
    done = cli("sim-root", PRESET, str(tmp_path / "tree"))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "tree/proc/driver/nvidia-caps/mig-minors").stat().st_size > 0
    assert (tmp_path / "tree/dev/nvidia7").exists()
    assert is_sim_root(str(tmp_path / "tree"))  # marked as what it is, by what wrote it
    # NUMA affinity where the kernel shows it, as discovery reads it from a real host.
    node = read_node(resolve_node_path(PRESET))
    read_numa = sysfs_numa_reader(str(tmp_path / "tree"))
    assert [read_numa(gpu.pci_bus_id) for gpu in node.gpus] == [gpu.numa_node for gpu in node.gpus]
    refused = cli("sim-root", "no-such-node", str(tmp_path / "other"))
    assert refused.returncode != 0 and "no-such-node" in refused.stderr


def test_serve_keeps_serving_without_a_cdi_strategy_and_writes_nothing() -> None:
    async def body() -> None:
        async with running_plugin() as plugin:
            assert not plugin.cdi_spec.exists()
            response = await plugin.kubelet.allocate(GPU, [[advertised(plugin, GPU)[0]]])
            assert not response.container_responses[0].cdi_devices
            assert isinstance(response, api_pb2.AllocateResponse)

    run(body())


def test_serve_simulates_without_a_writable_temp_dir(monkeypatch: Any, tmp_path: Path) -> None:
    """A read-only root with no /tmp mount must not stop a simulated plugin: it serves with
    the real host's files instead of a laid-out tree, and says so."""
    import tempfile

    from deviceplugin.runtime import scratch

    monkeypatch.setattr(scratch, "MEMORY_DIR", str(tmp_path / "no-shm"))
    real_mkdtemp = tempfile.mkdtemp

    def read_only_tmp(*args: Any, **kwargs: Any) -> str:
        if kwargs.get("prefix") == "dp-simhost-":
            raise OSError(30, "Read-only file system", "/tmp")
        return real_mkdtemp(*args, **kwargs)

    monkeypatch.setattr(tempfile, "mkdtemp", read_only_tmp)

    async def body() -> None:
        async with running_plugin() as plugin:
            assert plugin.supervisor.engine.host is None
            assert set(plugin.kubelet.resources()) == {GPU, MIG}

    run(body())


@pytest.mark.parametrize("memory", [True, False])
def test_the_temporary_tree_is_laid_out_in_memory_where_there_is_some(
    monkeypatch: Any, tmp_path: Path, memory: bool
) -> None:
    """/dev/shm first (a stand-in here), the temp dir when there is none; removed at stop."""
    import tempfile

    from deviceplugin.runtime import scratch

    monkeypatch.setattr(scratch, "MEMORY_DIR", str(tmp_path if memory else tmp_path / "none"))

    async def body() -> Path:
        async with running_plugin() as plugin:
            simulated = plugin.supervisor.engine.host
            assert simulated is not None and simulated.temporary
            root = Path(simulated.root)
            assert (root / "proc/driver/nvidia-caps/mig-minors").is_file()
            assert stat.S_IMODE(root.stat().st_mode) == 0o700  # as tempfile.mkdtemp makes it
            assert set(plugin.kubelet.resources()) == {GPU, MIG}
            return root

    root = run(body())
    assert root.parent == (tmp_path if memory else Path(tempfile.gettempdir()))
    assert root.name.startswith("dp-simhost-") and not root.exists()


def test_a_driver_root_without_proc_gets_the_simulated_kernel_modules_files(
    tmp_path: Path,
) -> None:
    """A tree of device nodes only (no `proc/`): the simulator supplies mig-minors and the
    majors, so MIG devices are defined and their device specs answered."""
    root = tmp_path / "devonly"
    lay_out(read_node(resolve_node_path(PRESET)), root)
    shutil.rmtree(root / "proc")

    async def body() -> str:
        env = {**CDI_CRI, "NVIDIA_DRIVER_ROOT": str(root)}
        async with running_plugin(env=env) as plugin:
            host = plugin.supervisor.engine.host
            assert host is not None and not host.temporary
            assert not host.proc_root.startswith(str(root))
            spec = read_spec(plugin)
            mig_id = advertised(plugin, MIG)[0]
            (name,) = await cdi_names(plugin, MIG, mig_id)
            device = spec_devices(spec)[name.removeprefix(f"{KIND}=")]
            caps = [p for p in node_paths(device) if "nvidia-caps" in p]
            assert len(caps) == 2
            return host.proc_root

    proc = run(body())
    assert not os.path.exists(proc)  # the temporary proc tree is gone
    assert root.exists()  # the user's tree is left alone


def test_capability_files_follow_the_drivers_rule_beyond_the_mig_minors_table() -> None:
    """The kernel module's /proc/driver/nvidia/capabilities files name the minors mig-minors
    lists, and follow the same rule past its 32 GPUs (a 64-GPU node of the benchmark)."""
    from deviceplugin.sim.hostroot import capability_files, mig_minors_table

    node = read_node(resolve_node_path(PRESET))
    table = mig_minors_table()
    files = capability_files(node)
    assert files and all(table[key.replace("/mig/", "/")] == minor for key, minor in files.items())
    far = replace(node, gpus=tuple(replace(gpu, minor=gpu.minor + 40) for gpu in node.gpus))
    assert len(capability_files(far)) == len(files)
