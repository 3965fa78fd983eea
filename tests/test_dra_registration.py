"""The registration socket on its own, against the plugin-watcher emulator: what GetInfo says,
that the outcome comes back through NotifyRegistrationStatus, that removing the socket
deregisters and re-creating it registers again."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

from deviceplugin.dra.registration import RegistrationServer, plugin_dir, registration_socket
from deviceplugin.sim.pluginwatcher import PluginWatcher

DRIVER = "gpu.nvidia.com"


def short_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="drareg", dir="/tmp"))


def test_register_notify_deregister_and_register_again() -> None:
    async def body() -> None:
        root = short_dir()
        statuses: list[tuple[bool, str]] = []
        endpoint = plugin_dir(root, DRIVER) / "dra.sock"
        server = RegistrationServer(
            DRIVER,
            endpoint,
            registration_socket(root, DRIVER),
            on_status=lambda ok, error: statuses.append((ok, error)),
        )
        watcher = PluginWatcher(root, connect_timeout=0.1)
        try:
            await server.start()
            await watcher.start()
            plugin = await watcher.wait_registered(DRIVER)
            assert plugin.endpoint == str(endpoint)
            assert not plugin.connected  # nothing serves the DRA socket; the kubelet accepts it
            async with asyncio.timeout(5):
                while not statuses:
                    await asyncio.sleep(0.01)
            assert statuses == [(True, "")] and server.registered

            await server.stop()
            assert not registration_socket(root, DRIVER).exists()
            await watcher.wait_deregistered(DRIVER)

            await server.start()
            await watcher.wait_registered(DRIVER)
            assert [a.ok for a in watcher.attempts] == [True, True]
        finally:
            await watcher.stop()
            await server.stop()
            shutil.rmtree(root, ignore_errors=True)

    asyncio.run(body())


def test_a_plugin_of_another_type_is_refused_with_the_kubelets_text() -> None:
    class CsiLike(RegistrationServer):
        async def GetInfo(self, request, context):  # type: ignore[no-untyped-def]
            info = await super().GetInfo(request, context)
            info.type = "CSIPlugin"
            return info

    async def body() -> None:
        root = short_dir()
        statuses: list[tuple[bool, str]] = []
        socket = registration_socket(root, DRIVER)
        server = CsiLike(DRIVER, root / "dra.sock", socket, lambda *s: statuses.append(s))
        watcher = PluginWatcher(root)
        try:
            await server.start()
            await watcher.start()
            async with asyncio.timeout(5):
                while not statuses:
                    await asyncio.sleep(0.01)
            assert statuses[0] == (
                False,
                f"no handler registered for plugin type: CSIPlugin at socket {socket}",
            )
            assert DRIVER not in watcher.plugins and not server.registered
        finally:
            await watcher.stop()
            await server.stop()
            shutil.rmtree(root, ignore_errors=True)

    asyncio.run(body())
