"""`deviceplugin demo`: the plugin on a simulated node, told from the kubelet's side.

Runs the real supervisor (servers, registration, health, file watchers) on the simulator preset
`a100-80gb-x8-mixed` with the seed ConfigMap, against the in-process kubelet emulator, in a
temp dir. Needs no GPU, no cluster and no root.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

from deviceplugin.ops.metrics import Metrics
from deviceplugin.plugin.service import run_supervisor
from deviceplugin.plugin.supervisor import Supervisor
from deviceplugin.runtime.options import ServeOptions
from deviceplugin.sim.kubelet import KubeletEmulator
from deviceplugin.sim.simulator import simulator_for

PRESET = "a100-80gb-x8-mixed"
SEED_CONFIG = """\
version: v1
flags:
  migStrategy: mixed
sharing:
  timeSlicing:
    resources:
      - name: nvidia.com/gpu
        replicas: {replicas}
"""


def write_configmap(directory: Path, text: str) -> Path:
    """Lay out or update a ConfigMap volume the way the kubelet does: write a new timestamped
    directory, point `..data_tmp` at it, rename it over `..data`."""
    directory.mkdir(parents=True, exist_ok=True)
    stamp = directory / f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{time.monotonic_ns()}"
    stamp.mkdir()
    (stamp / "config.yaml").write_text(text)
    tmp_link = directory / "..data_tmp"
    os.symlink(stamp.name, tmp_link)
    os.replace(tmp_link, directory / "..data")
    key = directory / "config.yaml"
    if not key.is_symlink():
        os.symlink("..data/config.yaml", key)
    return key


def _say(step: str, text: str) -> None:
    print(f"[{step}] {text}", flush=True)


def _show(kubelet: KubeletEmulator) -> None:
    for name in kubelet.resources():
        devices = kubelet.devices(name)
        print(f"      {name:<28} allocatable {kubelet.allocatable(name):>2} of {len(devices)}")


async def demo() -> int:
    """Walk through registration, Allocate, a health event and a config reload."""
    logging.getLogger().setLevel(logging.WARNING)
    root = Path(tempfile.mkdtemp(prefix="dp-demo-"))
    kubelet = KubeletEmulator(root / "k")
    await kubelet.start()
    config = write_configmap(root / "cm", SEED_CONFIG.format(replicas=2))
    events = root / "events.jsonl"
    events.touch()
    settings = ServeOptions(
        kubelet_dir=root / "k",
        cdi_spec_dir=root / "cdi",  # never the host's: a demo must not touch a real node's spec
        simulate=PRESET,
        simulate_events=str(events),
        config_file=str(config),
        health_recovery_after="off",
        env={},
    )
    supervisor = Supervisor(settings, Metrics(), simulator_for(settings.simulate))
    runner = asyncio.get_running_loop().create_task(run_supervisor(supervisor))
    try:
        _say("1/5", f"plugin started on simulated node '{PRESET}' with the seed ConfigMap")
        expected = {"nvidia.com/gpu": 8, "nvidia.com/mig-1g.10gb": 28}
        await kubelet.wait_for(
            lambda: all(kubelet.allocatable(n) == c for n, c in expected.items()), timeout=10
        )
        _say("1/5", "the kubelet sees these resources registered:")
        _show(kubelet)

        device = sorted(kubelet.devices("nvidia.com/gpu"))[0]
        response = await kubelet.allocate("nvidia.com/gpu", [[device]])
        envs = dict(response.container_responses[0].envs)
        _say("2/5", f"Allocate nvidia.com/gpu [{device}] -> {json.dumps(envs)}")

        physical = device.split("::")[0]
        with events.open("a") as file:
            file.write(json.dumps({"uuid": physical, "xid": 79}) + "\n")
        await kubelet.wait_for(lambda: kubelet.allocatable("nvidia.com/gpu") == 6, timeout=5)
        bad = sorted(i for i, d in kubelet.devices("nvidia.com/gpu").items() if not d.healthy)
        _say("3/5", f"Xid 79 on {physical}: Unhealthy at the kubelet: {', '.join(bad)}")
        _show(kubelet)

        write_configmap(root / "cm", SEED_CONFIG.format(replicas=4))
        await kubelet.wait_for(lambda: len(kubelet.devices("nvidia.com/gpu")) == 16, timeout=5)
        _say("4/5", "ConfigMap edited (replicas 2 -> 4), reloaded without a restart:")
        _show(kubelet)

        await kubelet.restart()
        await kubelet.wait_for(
            lambda: (
                kubelet.allocatable("nvidia.com/mig-1g.10gb") == 28
                and kubelet.allocatable("nvidia.com/gpu") == 12
            ),
            timeout=5,
        )
        _say("5/5", "kubelet restarted (sockets deleted): the plugin re-registered by itself:")
        _show(kubelet)
        return 0
    finally:
        supervisor.engine.request_stop()
        with contextlib.suppress(Exception):
            await runner
        await kubelet.stop()
        shutil.rmtree(root, ignore_errors=True)
