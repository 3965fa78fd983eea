"""Lifecycle end to end with the real watchers on real files and sockets: ConfigMap swaps,
bad files, kubelet restarts, deleted sockets, MIG re-cuts, signals and shutdown."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from pathlib import Path

import grpc
import pytest
import yaml
from harness import GPU, MIG, SEED, Plugin, run, running_plugin

from deviceplugin.sim.kubelet import KubeletEmulator
from deviceplugin.sim.node import PRESETS_DIR
from deviceplugin.wire.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc

DEVICEPLUGIN = str(Path(sys.executable).with_name("deviceplugin"))


def reloads(plugin: Plugin, result: str) -> float:
    value = plugin.supervisor.metrics.registry.get_sample_value(
        "deviceplugin_config_reloads_total", {"result": result}
    )
    return value or 0.0


def registrations(kubelet: KubeletEmulator, resource: str) -> int:
    return sum(1 for r in kubelet.registrations if r.resource == resource and r.ok)


def test_configmap_swap_updates_changed_resources_and_leaves_others_alone() -> None:
    async def body() -> None:
        async with running_plugin() as plugin:
            kubelet = plugin.kubelet
            mig_endpoint = kubelet.endpoints[MIG]
            plugin.swap_config(SEED.format(replicas=4))
            await plugin.until(lambda: len(kubelet.devices(GPU)) == 16)
            assert kubelet.allocatable(GPU) == 16
            assert kubelet.endpoints[MIG] is mig_endpoint and mig_endpoint.connected
            assert registrations(kubelet, MIG) == 1 and registrations(kubelet, GPU) == 1
            assert reloads(plugin, "applied") == 1

    run(body())


def test_unchanged_content_does_nothing() -> None:
    async def body() -> None:
        async with running_plugin() as plugin:
            updates = plugin.kubelet.endpoints[GPU].updates
            plugin.swap_config(SEED.format(replicas=2))
            await plugin.until(lambda: reloads(plugin, "unchanged") >= 1)
            assert reloads(plugin, "applied") == 0
            assert plugin.kubelet.endpoints[GPU].updates == updates

    run(body())


BAD_FILES = [
    pytest.param("version: v1\nflags: [unclosed\n", "", id="bad-yaml"),
    pytest.param(
        SEED.format(replicas=2).replace("replicas:", "replica:"),
        "sharing.timeSlicing.resources[0]",
        id="typo-key",
    ),
    pytest.param(
        SEED.format(replicas=0), "sharing.timeSlicing.resources[0].replicas", id="replicas-zero"
    ),
    pytest.param(
        SEED.format(replicas=2).replace("nvidia.com/gpu", "Bad Name/gpu"),
        "sharing.timeSlicing.resources[0].name",
        id="bad-resource-name",
    ),
]


@pytest.mark.parametrize(("text", "field"), BAD_FILES)
def test_bad_config_keeps_the_last_good_one(
    text: str, field: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def body() -> None:
        async with running_plugin() as plugin:
            plugin.swap_config(text)
            await plugin.until(lambda: reloads(plugin, "rejected") == 1)
            assert plugin.kubelet.allocatable(GPU) == 8 and plugin.kubelet.allocatable(MIG) == 28
            status = plugin.supervisor.status()
            assert status.ready and status.core.last_config_error
            plugin.swap_config(SEED.format(replicas=3))
            await plugin.until(lambda: len(plugin.kubelet.devices(GPU)) == 12)

    run(body())
    rejected = [r for r in caplog.records if r.getMessage() == "config.rejected"]
    assert rejected and rejected[0].dp_fields["field"].startswith(field)


def test_deleted_config_file_keeps_serving() -> None:
    async def body() -> None:
        async with running_plugin() as plugin:
            (plugin.root / "cm" / "config.yaml").unlink()
            await plugin.until(lambda: reloads(plugin, "rejected") == 1)
            assert plugin.kubelet.allocatable(GPU) == 8

    run(body())


def test_sighup_style_forced_reload_applies_even_unchanged_content() -> None:
    async def body() -> None:
        async with running_plugin() as plugin:
            assert await plugin.supervisor.reload("SIGHUP", force=True)
            assert reloads(plugin, "applied") == 1
            assert registrations(plugin.kubelet, GPU) == 1

    run(body())


def test_kubelet_restarts_twenty_times_in_a_row() -> None:
    async def body() -> None:
        async with running_plugin() as plugin:
            kubelet = plugin.kubelet
            for n in range(2, 22):
                await kubelet.restart()
                await plugin.until(
                    lambda n=n: (
                        registrations(kubelet, GPU) == n
                        and registrations(kubelet, MIG) == n
                        and kubelet.allocatable(GPU) == 8
                        and kubelet.allocatable(MIG) == 28
                    ),
                    timeout=3,
                )
            assert (plugin.kubelet_dir / "nvidia-gpu.sock").exists()
            await plugin.until(lambda: plugin.supervisor.status().ready)

    run(body())


def test_deleted_plugin_socket_is_served_and_registered_again() -> None:
    async def body() -> None:
        async with running_plugin() as plugin:
            sock = plugin.kubelet_dir / "nvidia-mig-1g.10gb.sock"
            sock.unlink()
            await plugin.until(lambda: registrations(plugin.kubelet, MIG) == 2)
            assert sock.exists()
            await plugin.until(lambda: plugin.kubelet.allocatable(MIG) == 28)

    run(body())


def recut(node_file: Path, profiles_by_gpu: dict[int, list[str]]) -> None:
    """Rewrite a node file with new MIG layouts for some GPUs."""
    node = yaml.safe_load(node_file.read_text())
    for index, profiles in profiles_by_gpu.items():
        gpu = node["gpus"][index]
        gpu["migDevices"] = [
            {
                "profile": p,
                "uuid": f"MIG-{index:08x}-{n:04x}-4000-8000-00000000aaaa",
                "gpuInstanceId": 1 + n,
                "computeInstanceId": 0,
            }
            for n, p in enumerate(profiles)
        ]
    node_file.write_text(yaml.safe_dump(node))


def test_mig_recut_removes_and_adds_sockets(tmp_path: Path) -> None:
    node_file = tmp_path / "node.yaml"
    node_file.write_text((PRESETS_DIR / "a100-80gb-x8-mixed.yaml").read_text())

    async def body() -> None:
        async with running_plugin(simulate=str(node_file)) as plugin:
            kubelet = plugin.kubelet
            recut(node_file, {i: ["3g.40gb", "3g.40gb"] for i in range(4)})
            assert await plugin.supervisor.rediscover()
            new = "nvidia.com/mig-3g.40gb"
            await plugin.until(lambda: kubelet.allocatable(new) == 8)
            assert not (plugin.kubelet_dir / "nvidia-mig-1g.10gb.sock").exists()
            assert (plugin.kubelet_dir / "nvidia-mig-3g.40gb.sock").exists()
            await plugin.until(lambda: kubelet.allocatable(MIG) == 0)
            assert MIG not in plugin.supervisor.status().resources
            assert kubelet.allocatable(GPU) == 8

    run(body())


def test_hostile_clients_do_not_disturb_others() -> None:
    async def body() -> None:
        async with running_plugin() as plugin:
            kubelet = plugin.kubelet
            path = str(plugin.kubelet_dir / "nvidia-gpu.sock")
            raw = socket.socket(socket.AF_UNIX)
            raw.connect(path)
            raw.sendall(b"\x00\xffnot http2 at all" * 64)
            raw.close()
            async with grpc.aio.insecure_channel(f"unix://{path}") as channel:
                stub = api_pb2_grpc.DevicePluginStub(channel)
                stalled = stub.ListAndWatch(api_pb2.Empty())  # opened, never read
                many = [f"GPU-junk-{n}::0" for n in range(10_000)]
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await kubelet.allocate(GPU, [many])
                details = caught.value.details() or ""
                assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
                assert "GPU-junk-0::0" in details and len(details) < 1000
                victim = sorted(kubelet.devices(GPU))[0].split("::")[0]
                for xid in (79, 48, 62):
                    plugin.event(uuid=victim, xid=xid)
                await plugin.until(lambda: kubelet.allocatable(GPU) == 6)
                good = sorted(i for i, d in kubelet.devices(GPU).items() if d.healthy)[0]
                assert (await kubelet.allocate(GPU, [[good]])).container_responses
                stalled.cancel()

    run(body())


async def _serve_process(plugin_dir: Path, *extra: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        DEVICEPLUGIN,
        "serve",
        "--kubelet-dir",
        str(plugin_dir),
        "--cdi-spec-dir",
        str(plugin_dir.parent / "cdi"),
        *extra,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )


def test_sigterm_exits_zero_and_leaves_no_socket(tmp_path: Path) -> None:
    async def body() -> None:
        import tempfile

        kdir = Path(tempfile.mkdtemp(prefix="dps"))
        kubelet = KubeletEmulator(kdir)
        await kubelet.start()
        proc = await _serve_process(kdir, "--simulate", "h100-x8")
        try:
            assert await kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 8, 10)
            proc.send_signal(signal.SIGHUP)
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 5) == 0
            left = [p.name for p in kdir.iterdir() if p.name != "kubelet.sock"]
            assert left == []
        finally:
            if proc.returncode is None:
                proc.kill()
            await kubelet.stop()

    run(body())


@pytest.mark.skipif(os.path.exists("/dev/nvidiactl"), reason="this host has an NVIDIA driver")
def test_without_nvml_fail_on_init_error_decides_exit_or_idle() -> None:
    async def body() -> None:
        import tempfile

        kdir = Path(tempfile.mkdtemp(prefix="dpn"))
        failing = await _serve_process(kdir)
        assert await asyncio.wait_for(failing.wait(), 10) == 1
        assert b"nvml.init.failed" in await failing.stderr.read()  # type: ignore[union-attr]
        idle = await _serve_process(kdir, "--fail-on-init-error", "false")
        stderr = idle.stderr
        assert stderr is not None

        async def unavailable() -> None:  # logged once its signal handlers are in place
            while b"nvml.unavailable" not in await stderr.readline():
                assert not stderr.at_eof(), "exited without saying NVML is unavailable"

        await asyncio.wait_for(unavailable(), 30)
        await asyncio.sleep(1.0)
        assert idle.returncode is None, "idles instead of exiting"
        idle.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(idle.wait(), 5) == 0

    run(body())


def test_plain_config_file_edits_reload_and_reads_do_not_loop() -> None:
    async def body() -> None:
        async with running_plugin(configmap=False) as plugin:
            config = plugin.root / "cm" / "config.yaml"
            config.write_text(SEED.format(replicas=3))
            await plugin.until(lambda: len(plugin.kubelet.devices(GPU)) == 12)
            (plugin.root / "cm" / "unrelated.txt").write_text("x")
            await asyncio.sleep(0.5)
            assert reloads(plugin, "applied") == 1
            assert reloads(plugin, "unchanged") <= 1, "a reload's own read must not trigger one"

    run(body())


def test_a_config_that_is_not_utf8_is_rejected_and_the_error_clears() -> None:
    async def body() -> None:
        async with running_plugin(configmap=False) as plugin:
            config = plugin.root / "cm" / "config.yaml"
            good = config.read_bytes()
            config.write_bytes(good + b"# \xff\xfe\n")
            await plugin.until(lambda: reloads(plugin, "rejected") == 1)
            assert "not UTF-8" in (plugin.supervisor.status().core.last_config_error or "")
            config.write_bytes(good)
            await plugin.until(lambda: plugin.supervisor.status().core.last_config_error is None)
            assert plugin.kubelet.allocatable(GPU) == 8 and reloads(plugin, "applied") == 0

    run(body())


def test_kubelet_down_makes_the_plugin_unready_until_it_returns() -> None:
    async def body() -> None:
        async with running_plugin() as plugin:
            await plugin.kubelet.stop()
            await plugin.until(lambda: not plugin.supervisor.status().ready)
            assert plugin.supervisor.status().kubelet_restarting
            await plugin.kubelet.start()
            await plugin.until(plugin.settled)
            restarts = plugin.supervisor.metrics.registry.get_sample_value(
                "deviceplugin_kubelet_restarts_total"
            )
            assert restarts == 1

    run(body())


def test_a_lost_gpu_stays_advertised_unhealthy_after_rediscovery() -> None:
    async def body() -> None:
        async with running_plugin() as plugin:
            kubelet = plugin.kubelet
            victim = sorted(kubelet.devices(GPU))[0].split("::")[0]
            plugin.event(uuid=victim, lost=True)
            await plugin.until(lambda: kubelet.allocatable(GPU) == 6)
            await plugin.supervisor.rediscover()
            devices = plugin.supervisor.status().resources[GPU].devices
            lost = [d for d in devices if d.physical_uuid == victim]
            assert len(devices) == 8 and [d.reason for d in lost] == ["gpu-lost", "gpu-lost"]
            assert len(kubelet.devices(GPU)) == 8 and kubelet.allocatable(GPU) == 6

    run(body())


def test_a_second_instance_serves_beside_the_first_as_a_rolling_update_runs_them() -> None:
    """A DaemonSet update with surge starts the new pod before the old one ends: the new
    `serve` binds a name beside the live socket and registers, the old keeps its own socket
    (no fight over one path), and when the old one stops only its socket goes."""

    async def body() -> None:
        import tempfile

        kdir = Path(tempfile.mkdtemp(prefix="dps"))
        kubelet = KubeletEmulator(kdir)
        await kubelet.start()
        old = await _serve_process(kdir, "--simulate", "h100-x8")
        new = None
        try:
            assert await kubelet.wait_for(lambda: kubelet.allocatable(GPU) == 8, 10)
            new = await _serve_process(kdir, "--simulate", "h100-x8")
            assert await kubelet.wait_for(lambda: registrations(kubelet, GPU) == 2, 10)
            assert kubelet.endpoints[GPU].endpoint == "nvidia-gpu-1.sock"
            await asyncio.sleep(2.5)  # a few socket checks: neither takes the other's path
            assert registrations(kubelet, GPU) == 2
            assert {"nvidia-gpu.sock", "nvidia-gpu-1.sock"} <= {p.name for p in kdir.iterdir()}
            old.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(old.wait(), 5) == 0
            assert "nvidia-gpu.sock" not in {p.name for p in kdir.iterdir()}
            await asyncio.sleep(1.5)
            assert registrations(kubelet, GPU) == 2 and kubelet.allocatable(GPU) == 8
            assert kubelet.endpoints[GPU].connected
        finally:
            for proc in (old, new):
                if proc is not None and proc.returncode is None:
                    proc.kill()
                    await proc.wait()
            await kubelet.stop()

    run(body())


def test_a_dropped_listandwatch_is_registered_again_and_the_devices_healthy_again() -> None:
    """Kubelets before 1.37 disconnect the endpoint a plugin just registered when a rolling
    update's old instance ends, and every device of the resource turns unhealthy to them; the
    plugin, no longer watched while registered, registers again and is watched again."""

    async def body() -> None:
        async with running_plugin() as plugin:
            kubelet = plugin.kubelet
            await plugin.until(lambda: kubelet.allocatable(GPU) == 8)
            before = registrations(kubelet, GPU)
            await kubelet.drop(GPU)
            assert kubelet.allocatable(GPU) == 0
            await plugin.until(lambda: registrations(kubelet, GPU) == before + 1, timeout=5)
            await plugin.until(lambda: kubelet.allocatable(GPU) == 8, timeout=5)
            assert kubelet.endpoints[GPU].connected
            assert registrations(kubelet, MIG) == 1  # the other resource was left alone
            await asyncio.sleep(2.5)  # a few checks later: registered once, not again
            assert registrations(kubelet, GPU) == before + 1

    run(body())
