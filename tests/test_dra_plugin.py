"""The kubelet side of the DRA driver, over the real sockets: registration through the
plugin-watcher emulator, NodePrepareResources / NodeUnprepareResources in v1 and v1beta1 with
claims read from the API-server stand-in, the CDI spec per claim as a runtime resolves it, the
checkpoint across a restart, per-claim errors, and health reaching the published slices."""

from __future__ import annotations

import asyncio
import json
import os
import time

import pytest

from deviceplugin.dra.checkpoint import read_boot_id
from deviceplugin.dra.driver import DraDriver
from deviceplugin.dra.registration import SUPPORTED_SERVICES
from deviceplugin.model.errors import NvmlError
from deviceplugin.model.hostpaths import capability_node, compute_instance_key, gpu_instance_key
from deviceplugin.runtime.options import DraServeOptions
from deviceplugin.sim.hostroot import mig_minors_table
from deviceplugin.sim.pluginwatcher import PluginWatcher
from tests.dranode import inventory
from tests.draplugin import (
    DRIVER,
    NODE,
    PRESET,
    claim,
    published,
    resolve,
    run,
    running_driver,
    short_dir,
)
from tests.simnode import gpu as simgpu
from tests.simnode import migs, write_node

FOUND = inventory(PRESET)
WHOLE = FOUND.gpus[5]  # a whole GPU under the mixed strategy
PARENT = FOUND.gpus[1]
MIG = PARENT.mig_devices[2]
WHOLE_NAME = f"gpu-{WHOLE.minor}"
MIG_NAME = f"gpu-{PARENT.minor}-mig-{MIG.gpu_instance_id}-{MIG.compute_instance_id}"
KIND = "k8s.gpu.nvidia.com/claim"


def test_the_driver_registers_through_the_plugin_watcher() -> None:
    async def body() -> None:
        async with running_driver() as node:
            plugin = node.watcher.plugins[DRIVER]
            assert plugin.service == "v1.DRAPlugin"
            assert plugin.endpoint == str(node.kubelet_root / "plugins" / DRIVER / "dra.sock")
            assert plugin.connected
            assert plugin.socket == node.kubelet_root / "plugins_registry" / f"{DRIVER}-reg.sock"
            (attempt,) = node.watcher.attempts
            assert attempt.ok and attempt.versions == (
                "v1.DRAPlugin",
                "v1beta1.DRAPlugin",
                "v1.DRAResourceHealth",
                "v1alpha1.DRAResourceHealth",
            )
            assert plugin.health_service == "v1.DRAResourceHealth"
            await node.until(lambda: node.driver.registration.registered)
            assert set(published(node.server)) >= {WHOLE_NAME, MIG_NAME}

    run(body)


def test_a_kubelet_that_speaks_only_v1beta1_chooses_it() -> None:
    async def body() -> None:
        async with running_driver(watcher=False) as node:
            old = PluginWatcher(node.kubelet_root, services=("v1beta1.DRAPlugin",))
            await old.start()
            try:
                assert (await old.wait_registered(DRIVER)).service == "v1beta1.DRAPlugin"
            finally:
                await old.stop()

    run(body)


def test_a_kubelet_that_knows_none_of_the_services_refuses_and_says_why() -> None:
    async def body() -> None:
        async with running_driver(watcher=False) as node:
            alpha = PluginWatcher(node.kubelet_root, services=("v1alpha4.Node",))
            await alpha.start()
            try:
                await node.until(lambda: bool(alpha.attempts))
                await node.until(lambda: not node.driver.registration.registered)
            finally:
                await alpha.stop()
            refused = alpha.attempts[0]
            assert not refused.ok and DRIVER not in alpha.plugins
            assert "none of services supported by the plugin" in refused.error
            assert list(SUPPORTED_SERVICES)[:2] == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]

    run(body)


@pytest.mark.parametrize("version", ["v1.DRAPlugin", "v1beta1.DRAPlugin"])
def test_prepare_writes_a_cdi_spec_per_claim_that_resolves_to_the_devices(version: str) -> None:
    async def body() -> None:
        async with running_driver() as node:
            ref = node.add_claim(claim("pair", [("gpu", WHOLE_NAME), ("mig", MIG_NAME)]))
            uid = ref[2]
            response = await node.watcher.prepare(DRIVER, [ref], version=version)
            entry = response.claims[uid]
            assert entry.error == ""
            devices = {d.device_name: d for d in entry.devices}
            assert sorted(devices) == sorted([WHOLE_NAME, MIG_NAME])
            assert all(d.pool_name == NODE for d in entry.devices)
            assert list(devices[WHOLE_NAME].request_names) == ["gpu"]
            assert list(devices[MIG_NAME].request_names) == ["mig"]
            whole_id = f"{KIND}={uid}-{WHOLE_NAME}"
            mig_id = f"{KIND}={uid}-{MIG_NAME}"
            assert list(devices[WHOLE_NAME].cdi_device_ids) == [whole_id]
            assert list(devices[MIG_NAME].cdi_device_ids) == [mig_id]
            assert (node.cdi_dir / f"k8s.gpu.nvidia.com-claim_{uid}.json").is_file()

            whole = resolve(node.cdi_dir, whole_id)
            paths = [n["path"] for n in whole["deviceNodes"]]
            assert f"/dev/nvidia{WHOLE.minor}" in paths and "/dev/nvidiactl" in paths
            assert f"/dev/nvidia{PARENT.minor}" not in paths
            assert "NVIDIA_VISIBLE_DEVICES=void" in whole["env"]
            assert any(m["containerPath"].endswith("libcuda.so.550.90.07") for m in whole["mounts"])
            node_of = {n["path"]: n for n in whole["deviceNodes"]}
            assert node_of[f"/dev/nvidia{WHOLE.minor}"]["minor"] == WHOLE.minor

            table = mig_minors_table()
            gi = gpu_instance_key(PARENT.minor, MIG.gpu_instance_id)
            ci = compute_instance_key(PARENT.minor, MIG.gpu_instance_id, MIG.compute_instance_id)
            mig_paths = [n["path"] for n in resolve(node.cdi_dir, mig_id)["deviceNodes"]]
            assert f"/dev/nvidia{PARENT.minor}" in mig_paths
            assert capability_node(table[gi]) in mig_paths
            assert capability_node(table[ci]) in mig_paths

    run(body)


def test_a_prepared_claim_survives_a_restart_and_unprepares_after_it() -> None:
    async def body() -> None:
        async with running_driver() as node:
            ref = node.add_claim(claim("kept", [("gpu", WHOLE_NAME)]))
            uid = ref[2]
            first = await node.watcher.prepare(DRIVER, [ref])
            checkpoint = json.loads(
                (node.kubelet_root / "plugins" / DRIVER / "checkpoint.json").read_text()
            )
            assert checkpoint["version"] == 2 and checkpoint["checksum"].startswith("sha256:")
            assert checkpoint["data"]["bootID"] == read_boot_id()
            assert list(checkpoint["data"]["claims"]) == [uid]
            assert checkpoint["data"]["claims"][uid]["state"] == "PrepareCompleted"

            await node.restart()
            await node.until(lambda: len(node.watcher.attempts) == 2)
            reads = len([r for r in node.server.requests if "resourceclaims" in r[1]])
            again = await node.watcher.prepare(DRIVER, [ref])
            assert again == first
            assert len([r for r in node.server.requests if "resourceclaims" in r[1]]) == reads

            del node.server.claims[("default", "kept")]  # the claim is gone from the API
            await node.restart()
            await node.until(lambda: len(node.watcher.attempts) == 3)
            done = await node.watcher.unprepare(DRIVER, [ref])
            assert done.claims[uid].error == ""
            assert not (node.cdi_dir / f"k8s.gpu.nvidia.com-claim_{uid}.json").exists()
            assert node.driver.preparer is not None and node.driver.preparer.prepared == {}

    run(body)


def test_unprepare_is_idempotent_and_an_unknown_claim_is_already_unprepared() -> None:
    async def body() -> None:
        async with running_driver() as node:
            ref = node.add_claim(claim("once", [("gpu", MIG_NAME)]))
            await node.watcher.prepare(DRIVER, [ref], version="v1beta1.DRAPlugin")
            assert list(node.cdi_dir.glob("*.json"))
            unknown = ("default", "never", "00000000-0000-0000-0000-000000000000")
            for version in ("v1.DRAPlugin", "v1beta1.DRAPlugin"):
                done = await node.watcher.unprepare(DRIVER, [ref, unknown], version=version)
                assert {uid: e.error for uid, e in done.claims.items()} == {
                    ref[2]: "",
                    unknown[2]: "",
                }
            assert list(node.cdi_dir.glob("*.json")) == []

    run(body)


def test_each_claim_that_cannot_be_prepared_gets_its_own_error() -> None:
    async def body() -> None:
        async with running_driver() as node:
            good = node.add_claim(claim("good", [("gpu", WHOLE_NAME)]))
            missing = ("default", "missing", "11111111-1111-1111-1111-111111111111")
            stray = node.add_claim(claim("stray", [("gpu", "gpu-99")]))
            elsewhere = node.add_claim(claim("elsewhere", [("gpu", WHOLE_NAME)], pool="node-2"))
            pending = node.add_claim(claim("pending", [("gpu", WHOLE_NAME)], allocated=False))
            recreated = (good[0], good[1], "22222222-2222-2222-2222-222222222222")
            refs = [good, missing, stray, elsewhere, pending, recreated]
            response = await node.watcher.prepare(DRIVER, refs)
            errors = {uid: entry.error for uid, entry in response.claims.items()}
            assert set(errors) == {r[2] for r in refs}
            assert errors[good[2]] == "" and len(response.claims[good[2]].devices) == 1
            assert errors[missing[2]] == "ResourceClaim default/missing not found"
            assert "'gpu-99'" in errors[stray[2]] and "not a device" in errors[stray[2]]
            assert "'node-2'" in errors[elsewhere[2]]
            assert errors[pending[2]] == "ResourceClaim default/pending is not allocated"
            assert "deleted and re-created" in errors[recreated[2]]
            assert [p.name for p in node.cdi_dir.glob("*.json")] == [
                f"k8s.gpu.nvidia.com-claim_{good[2]}.json"
            ]
            assert node.driver.preparer is not None
            assert list(node.driver.preparer.prepared) == [good[2]]

    run(body)


def test_a_slow_disk_does_not_stall_the_event_loop_while_claims_prepare_and_unprepare(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every fsync of Prepare and Unprepare takes 0.5 s here; the loop, which also answers the
    kubelet's other calls and the health streams, keeps ticking meanwhile."""
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        time.sleep(0.5)
        real_fsync(fd)

    async def body() -> None:
        async with running_driver() as node:
            ref = node.add_claim(claim("slow", [("gpu", WHOLE_NAME)]))
            gaps: list[float] = []

            async def tick() -> None:
                loop = asyncio.get_running_loop()
                while True:
                    began = loop.time()
                    await asyncio.sleep(0.01)
                    gaps.append(loop.time() - began)

            monkeypatch.setattr(os, "fsync", slow_fsync)
            ticker = asyncio.ensure_future(tick())
            try:
                began = time.monotonic()
                assert (await node.watcher.prepare(DRIVER, [ref])).claims[ref[2]].error == ""
                assert (await node.watcher.unprepare(DRIVER, [ref])).claims[ref[2]].error == ""
                assert time.monotonic() - began >= 2.0  # four fsyncs did happen, slowly
            finally:
                ticker.cancel()
                monkeypatch.setattr(os, "fsync", real_fsync)
            assert max(gaps) < 0.4, max(gaps)

    run(body)


def test_a_claim_of_another_driver_only_prepares_to_no_devices() -> None:
    async def body() -> None:
        async with running_driver() as node:
            ref = node.add_claim(claim("nic", [("nic", "eth-0")], driver="net.example.com"))
            response = await node.watcher.prepare(DRIVER, [ref])
            assert response.claims[ref[2]].error == ""
            assert list(response.claims[ref[2]].devices) == []
            assert list(node.cdi_dir.glob("*.json")) == []

    run(body)


def test_an_xid_flips_healthy_in_the_slice_and_recovery_restores_it() -> None:
    def healthy(node_devices: dict[str, dict[str, object]], name: str) -> object:
        attributes = node_devices[name]["attributes"]
        assert isinstance(attributes, dict)
        return attributes["nvidia.com/healthy"]["bool"]

    async def body() -> None:
        async with running_driver(recovery="3s") as node:
            assert healthy(published(node.server), WHOLE_NAME) is True
            node.event(uuid=WHOLE.uuid, xid=79)
            await node.until(lambda: healthy(published(node.server), WHOLE_NAME) is False)
            sick = published(node.server)[WHOLE_NAME]
            assert sick["taints"][0]["key"] == f"{DRIVER}/unhealthy"
            others = [n for n in published(node.server) if n != WHOLE_NAME]
            assert all(healthy(published(node.server), n) is True for n in others)
            await node.until(lambda: healthy(published(node.server), WHOLE_NAME) is True, 30.0)
            assert "taints" not in published(node.server)[WHOLE_NAME]

    run(body)


def test_slices_the_kubelet_wiped_come_back_when_the_plugin_registers_again() -> None:
    async def body() -> None:
        async with running_driver(watcher=False) as node:
            before = published(node.server)
            node.server.slices.clear()  # the kubelet's wipe while no plugin was registered
            watcher = PluginWatcher(node.kubelet_root)
            await watcher.start()
            try:
                await watcher.wait_registered(DRIVER)
                await node.until(lambda: published(node.server).keys() == before.keys())
            finally:
                await watcher.stop()

    run(body)


def test_a_wipe_after_registering_is_repaired_without_another_registration() -> None:
    async def body() -> None:
        async with running_driver() as node:
            await node.until(lambda: node.driver.registration.registered)
            before = published(node.server)
            # The restarted kubelet's wipe, landing after the driver registered with it.
            await node.until(lambda: node.server.open_watches("resourceslices") == 1)
            node.server.wipe(NODE, DRIVER)
            assert published(node.server) == {}
            await node.until(lambda: published(node.server).keys() == before.keys())
            assert len(node.watcher.attempts) == 1  # put back by the watch, not a registration

    run(body)


def test_a_deleted_registration_socket_is_served_again_and_the_driver_registers_anew() -> None:
    async def body() -> None:
        async with running_driver() as node:
            socket = node.driver.registration.socket
            socket.unlink()  # a kubelet restart that cleaned plugins_registry
            await node.watcher.wait_deregistered(DRIVER)
            await node.driver.heal_sockets()
            assert socket.exists()
            await node.watcher.wait_registered(DRIVER)
            assert [a.ok for a in node.watcher.attempts] == [True, True]
            dra_socket = node.driver.dra_socket
            dra_socket.unlink()
            await node.driver.heal_sockets()
            assert dra_socket.exists()

    run(body)


def test_a_mig_recut_is_republished_and_prepared_from_the_new_devices() -> None:
    node_file = write_node(
        short_dir("dranode") / "node.yaml",
        [simgpu(0), simgpu(1, **migs(1, "1g.10gb", "1g.10gb"))],
    )

    def mig_names(devices: dict[str, dict[str, object]]) -> set[str]:
        return {name for name in devices if "-mig-" in name}

    async def body() -> None:
        async with running_driver(simulate=str(node_file)) as node:
            before = mig_names(published(node.server))
            assert len(before) == 2
            assert await node.driver.rediscover() is False  # nothing changed: nothing written
            write_node(node_file, [simgpu(0), simgpu(1, **migs(1, *["1g.10gb"] * 3))])
            assert await node.driver.rediscover() is True
            await node.synced()
            after = mig_names(published(node.server))
            assert len(after) == 3 and before < after
            (new,) = after - before
            ref = node.add_claim(claim("recut", [("gpu", new)]))
            entry = (await node.watcher.prepare(DRIVER, [ref])).claims[ref[2]]
            assert entry.error == ""
            assert [d.device_name for d in entry.devices] == [new]

    run(body)


@pytest.mark.skipif(os.path.exists("/dev/nvidiactl"), reason="this host has an NVIDIA driver")
@pytest.mark.usefixtures("no_nvml_library")
def test_without_nvml_fail_on_init_error_decides_raise_or_idle() -> None:
    """Real NVML on a host without a driver: failOnInitError true raises (exit 1 in
    `__main__`); false idles, publishing nothing and registering nothing, even after the
    periodic socket check."""

    def driver(fail: str) -> DraDriver:
        root = short_dir()
        return DraDriver(
            DraServeOptions(
                overrides={"fail_on_init_error": fail},
                kubelet_root=root / "kubelet",
                cdi_spec_dir=root / "cdi",
                node_name=NODE,
            )
        )

    async def body() -> None:
        failing = driver("true")
        with pytest.raises(NvmlError):
            await failing.start()
        await failing.stop()
        idle = driver("false")
        await idle.start()
        await idle.heal_sockets()
        assert not idle.registration.socket.exists() and not idle.dra_socket.exists()
        assert await idle.rediscover() is False
        await idle.stop()

    run(body)
