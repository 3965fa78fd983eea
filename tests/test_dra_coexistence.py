"""One GPU, one owner: the DRA driver publishes nothing while a device plugin serves NVIDIA GPUs
on the node, says why where operators look, and publishes again once the plugin is gone (and
the kubelet's PodResources says none of its pods is left: test_dra_plugin_holds.py)."""

from __future__ import annotations

import socket
from pathlib import Path

from deviceplugin.dra.coexistence import live_device_plugins
from deviceplugin.sim.podresources import PodResourcesEmulator
from tests.draplugin import published, run, running_driver, short_dir


def listening(path: Path) -> socket.socket:
    path.parent.mkdir(parents=True, exist_ok=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen()
    return server


def test_only_nvidia_sockets_a_server_listens_on_count() -> None:
    directory = short_dir() / "device-plugins"
    live = listening(directory / "nvidia-gpu.sock")
    other = listening(directory / "kubelet.sock")
    stale = listening(directory / "nvidia-mig-1g.10gb.sock")
    stale.close()  # a killed plugin's socket file: still there, refusing connections
    (directory / "nvidia-notes.sock").write_text("not a socket")
    try:
        assert (directory / "nvidia-mig-1g.10gb.sock").exists()
        assert live_device_plugins(directory) == ("nvidia-gpu.sock",)
    finally:
        live.close()
        other.close()
    assert live_device_plugins(directory) == ()
    assert live_device_plugins(directory / "missing") == ()


def test_the_driver_stands_aside_while_a_device_plugin_serves_and_returns_after() -> None:
    async def body() -> None:
        async with running_driver() as node:
            assert len(published(node.server)) == 32
            pods = PodResourcesEmulator(node.kubelet_root)
            await pods.start()
            plugin = listening(node.kubelet_root / "device-plugins" / "nvidia-gpu.sock")
            try:
                await node.driver.check_node()
                await node.until(lambda: len(published(node.server)) == 0)
                reasons = node.driver.status().not_ready
                assert any(
                    "nvidia-gpu.sock" in r and "remove the device plugin" in r for r in reasons
                ), reasons
                assert node.driver.status().document()["device_plugin_conflict"]
            finally:
                plugin.close()  # the plugin stops; its socket file stays behind
            await node.driver.check_node()
            await node.until(lambda: len(published(node.server)) == 32)
            assert node.driver.status().not_ready == []
            await pods.stop()

    run(body)
