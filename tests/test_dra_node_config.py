"""The DRA driver follows the node's `nvidia.com/device-plugin.config` label as `serve` does:
`deviceplugin dra serve --config-dir` as a process, against the API-server stand-in (its slices
and its Node) and the plugin-watcher emulator, on real sockets."""

from __future__ import annotations

import asyncio
import json
import shutil
from typing import Any

from deviceplugin.model.configselect import CONFIG_LABEL
from deviceplugin.sim.apiserver import ApiServer
from deviceplugin.sim.pluginwatcher import PluginWatcher
from tests.draplugin import DRIVER, NODE, short_dir, start_serve
from tests.test_http import get, until
from tests.test_node_config import write_configmap

DEADLINE = 30.0


def test_dra_serve_switches_config_with_the_node_label_and_reports_unknown_names() -> None:
    async def body() -> None:
        root = short_dir("dranode")
        server = ApiServer()
        await server.start()
        server.add_node(NODE, {CONFIG_LABEL: "a"})
        kubelet = root / "kubelet"
        watcher = PluginWatcher(kubelet)
        await watcher.start()
        write_configmap(root / "config", {"a": "version: v1\n", "b": "version: v1\n"})
        process = await start_serve(
            root,
            server.url,
            kubelet,
            "--config-dir",
            str(root / "config"),
            "--default-config",
            "b",
            DP_HTTP_ADDRESS="127.0.0.1:0",
            DP_LOG_FORMAT="json",
        )
        lines: list[dict[str, Any]] = []

        async def read_log() -> None:
            assert process.stderr is not None
            async for raw in process.stderr:
                lines.append(json.loads(raw))

        reader = asyncio.get_running_loop().create_task(read_log())
        try:
            await until(
                lambda: (
                    any(line["event"] == "http.listening" for line in lines)
                    or process.returncode is not None
                )
            )
            port = next(line["port"] for line in lines if line["event"] == "http.listening")
            await watcher.wait_registered(DRIVER, DEADLINE)

            async def config() -> dict[str, Any]:
                document: dict[str, Any] = json.loads((await get(port, "/status"))[2])
                return document["config"]

            assert (await config())["source"].endswith("/a")
            server.set_node_labels(NODE, {CONFIG_LABEL: None})
            for _ in range(int(DEADLINE / 0.05)):
                if (await config())["source"].endswith("/b"):
                    break
                await asyncio.sleep(0.05)
            assert (await config())["selection"]["reason"] == "default"

            server.set_node_labels(NODE, {CONFIG_LABEL: "nope"})
            await until(lambda: bool(server.events))
            current = await config()
            assert current["source"].endswith("/b")  # the last good config is kept
            assert "'nope', which does not exist" in current["selection"]["error"]
            assert server.events[0]["involvedObject"]["name"] == NODE
            assert process.returncode is None
        finally:
            if process.returncode is None:
                process.terminate()
                await asyncio.wait_for(process.wait(), 15)
            reader.cancel()
            await watcher.stop()
            await server.stop()
            shutil.rmtree(root, ignore_errors=True)

    asyncio.run(body())
