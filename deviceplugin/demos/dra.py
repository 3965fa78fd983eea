"""`deviceplugin dra demo` (`make demo-dra`): the DRA driver on a simulated node, told from the
kubelet's and the scheduler's side.

Starts the API-server stand-in and the plugin-watcher emulator in this process, and
`deviceplugin dra serve --simulate a100-80gb-x8-mixed` as a child process pointed at them (a
kubeconfig file, a kubelet root and a CDI directory in a temp dir). Then: registration, the
published slices, a claim prepared into CDI devices, an Xid turning a device unhealthy in its
slice, Unprepare, and SIGTERM. Needs no GPU, no cluster and no root.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Collection
from pathlib import Path
from typing import Any

from deviceplugin.sim.apiserver import ApiServer
from deviceplugin.sim.pluginwatcher import PluginWatcher

PRESET = "a100-80gb-x8-mixed"
DRIVER = "gpu.nvidia.com"
NODE = "demo-node"
START_TIMEOUT = 30.0


def _say(step: str, text: str) -> None:
    print(f"[{step}] {text}", flush=True)


def _devices(server: ApiServer) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in server.slices.values() for d in s["spec"]["devices"]}


def _healthy(device: dict[str, Any]) -> bool:
    return bool(device["attributes"]["nvidia.com/healthy"]["bool"])


def _summary(device: dict[str, Any]) -> str:
    attributes = device["attributes"]
    what = attributes.get("profile", attributes["productName"])["string"]
    memory = device["capacity"]["memory"]["value"]
    return f"{attributes['type']['string']} {what}, {memory}, healthy={_healthy(device)}"


def _kubeconfig(path: Path, url: str) -> Path:
    context = {"cluster": "stand-in", "user": "driver"}
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "stand-in", "cluster": {"server": url}}],
                "users": [{"name": "driver", "user": {"token": "demo"}}],
                "contexts": [{"name": "demo", "context": context}],
                "current-context": "demo",
            }
        )
    )
    return path


def _claim(device: str) -> dict[str, Any]:
    request = {"name": "mig", "exactly": {"deviceClassName": "mig.nvidia.com"}}
    result = {"request": "mig", "driver": DRIVER, "pool": NODE, "device": device}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "training-job", "namespace": "default"},
        "spec": {"devices": {"requests": [request]}},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }


def _tainted(device: dict[str, Any] | None) -> bool:
    return device is not None and not _healthy(device) and bool(device.get("taints"))


async def _until(predicate: Any, timeout: float) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.02)


async def demo(root: Path, serve_env: Collection[str] = ()) -> int:
    """Run the story; 0 when the driver did every step and stopped cleanly. The driver runs
    without the variables named in `serve_env` (this process's serve settings)."""
    server = ApiServer()
    await server.start()
    kubelet = root / "kubelet"
    events = root / "events.jsonl"
    events.touch()
    watcher = PluginWatcher(kubelet)
    await watcher.start()
    env = {k: v for k, v in os.environ.items() if k not in serve_env}
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "deviceplugin", "dra", "serve", "--simulate", PRESET),
        *("--simulate-events", str(events), "--node-name", NODE),
        *("--kubeconfig", str(_kubeconfig(root / "kubeconfig", server.url))),
        *("--kubelet-root", str(kubelet), "--cdi-spec-dir", str(root / "cdi")),
        env=env,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        plugin = await watcher.wait_registered(DRIVER, START_TIMEOUT)
        attempt = watcher.attempts[-1]
        _say("register", f"{plugin.socket.name}: type DRAPlugin, name {plugin.name}")
        _say("register", f"  endpoint {plugin.endpoint}, offers {', '.join(attempt.versions)}")
        _say("register", f"  the kubelet chose {plugin.service}")

        devices = _devices(server)
        pool = next(iter(server.slices.values()))["spec"]["pool"]
        generation = pool["generation"]
        _say("slices", f"pool {pool['name']}, generation {generation}, {len(devices)} devices")
        kinds = {"gpu": 0, "mig": 0}
        for name, device in devices.items():
            kind = device["attributes"]["type"]["string"]
            kinds[kind] += 1
            if kinds[kind] <= 2:
                _say("slices", f"  {name}: {_summary(device)}")
        _say("slices", f"  ... {kinds['gpu']} GPUs and {kinds['mig']} MIG devices in all")

        mig = next(n for n, d in devices.items() if d["attributes"]["type"]["string"] == "mig")
        meta = server.add_claim(_claim(mig))["metadata"]
        ref = ("default", meta["name"], meta["uid"])
        answer = (await watcher.prepare(DRIVER, [ref])).claims[meta["uid"]]
        (prepared,) = answer.devices
        (cdi_id,) = prepared.cdi_device_ids
        _say("prepare", f"claim default/training-job ({meta['uid']}) allocated {mig}")
        _say("prepare", f"  CDI device {cdi_id}")
        spec_files = sorted((root / "cdi").glob("*.json"))
        spec = json.loads(spec_files[0].read_text())
        nodes = [n["path"] for n in spec["devices"][0]["containerEdits"]["deviceNodes"]]
        _say("prepare", f"  spec {spec_files[0].name}: {', '.join(nodes)}")

        uuid = devices[mig]["attributes"]["uuid"]["string"]
        # the driver taints an unhealthy device once its probe found the server keeps taints
        # (until then it leaves the device out): the probe's two dry runs come first
        await _until(lambda: len(server.dry_runs) >= 2, START_TIMEOUT)
        with events.open("a") as file:
            file.write(json.dumps({"uuid": uuid, "xid": 94}) + "\n")
        await _until(lambda: _tainted(_devices(server).get(mig)), 5)
        taint = _devices(server)[mig]["taints"][0]
        _say("health", f"Xid 94 on {mig}: healthy=false, taint {taint['key']}={taint['value']}")

        done = (await watcher.unprepare(DRIVER, [ref])).claims[meta["uid"]]
        left = len(list((root / "cdi").glob("*.json")))
        _say("unprepare", f"error={done.error!r}, CDI specs left: {left}")

        process.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(process.wait(), 15)
        await watcher.wait_deregistered(DRIVER)
        _say("stop", f"SIGTERM: exit {code}, sockets removed: {not plugin.socket.exists()}")
        return 0 if code == 0 else 1
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await watcher.stop()
        await server.stop()


def main(serve_env: Collection[str]) -> int:
    root = Path(tempfile.mkdtemp(prefix="dra-demo", dir="/tmp"))
    try:
        return asyncio.run(demo(root, serve_env))
    finally:
        shutil.rmtree(root, ignore_errors=True)
