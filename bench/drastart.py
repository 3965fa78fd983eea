"""`dra serve` from exec to its ResourceSlices published, and its memory once idle.

The real `deviceplugin dra serve` process on the simulated preset of the device-plugin figures,
publishing through its Kubernetes client to the API-server stand-in (`sim/apiserver.py`) in the
benchmark's own loop. Timed from the fork to the moment the stand-in holds every device of the
node; the stand-in validates each slice against the `resource.k8s.io/v1` schema as it arrives,
which a real API server does too, so that is in the figure. The floor is the echo's exec →
registered of the same run (`scenarios.startup`).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from bench import process
from bench.dra import discover_node, write_kubeconfig
from bench.nodes import DEFAULT_PRESET
from deviceplugin.model.slices import build_devices
from deviceplugin.sim.apiserver import ApiServer
from deviceplugin.sim.node import resolve_node_path

NODE = "bench-node"
TIMEOUT = 30.0
POLL = 0.001
IDLE = 1.0  # seconds after publishing before RSS is read, as for `serve`


def _published(server: ApiServer) -> int:
    return sum(len(piece["spec"]["devices"]) for piece in server.slices.values())


async def start_to_published(root: Path, repeats: int) -> tuple[list[float], float]:
    """Seconds from fork to every device of the node at the API server, `repeats` times, and
    the RSS (bytes) of the last process once idle."""
    expected = len(build_devices(discover_node(resolve_node_path(DEFAULT_PRESET))))
    samples: list[float] = []
    rss = 0
    for i in range(repeats):
        directory = root / f"dra{i}"
        directory.mkdir()
        server = ApiServer()
        await server.start()
        kubeconfig = write_kubeconfig(directory / "kubeconfig", server.url)
        child = process.dra_serve(directory, directory / "k", DEFAULT_PRESET, kubeconfig, NODE)
        try:
            child.start()
            deadline = child.started + TIMEOUT
            while _published(server) < expected:
                if time.monotonic() > deadline or not child.alive():
                    raise RuntimeError(f"dra serve published no slices:\n{child.tail()}")
                await asyncio.sleep(POLL)
            samples.append(time.monotonic() - child.started)
            await asyncio.sleep(IDLE)
            rss = child.rss_bytes()
        finally:
            await asyncio.to_thread(child.stop)
            await server.stop()
    return samples, rss
