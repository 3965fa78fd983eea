"""The CDI spec proved by a real consumer: `deviceplugin serve` on a simulated node whose driver
root holds real character devices, every advertised ID allocated alone through the project's
kubelet emulator, and a podman container started for each answer.

Inside each container: exactly the allocated device's nodes (a GPU's `/dev/nvidia<minor>`; a
MIG device's parent node and its two capability nodes, minors by the driver's formula) plus the
control nodes, each with the host's major:minor. The expectation is worked out from the
simulated node's file, not from the plugin's spec. Variants: `cdi-cri` with UUIDs,
`cdi-annotations`, `cdi-cri` with index IDs, and `--pass-device-specs` with the envvar
strategy (the response's device specs handed to podman as a kubelet would). Needs root and
podman: `make e2e`.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from deviceplugin.demos.plugin import SEED_CONFIG, write_configmap
from deviceplugin.sim.kubelet import KubeletEmulator
from deviceplugin.sim.node import Node, read_node, resolve_node_path
from deviceplugin.wire.deviceplugin.v1beta1 import api_pb2
from e2e.runtime import (
    CDI_KIND,
    cdi_args,
    device_nodes,
    expected_nodes,
    needs_podman,
    workload,
)

pytestmark = needs_podman

NODE = "a100-80gb-x8-mixed"
RESOURCES = {"nvidia.com/gpu": 8, "nvidia.com/mig-1g.10gb": 28}
SPEC_FILE = "k8s.device-plugin.nvidia.com-gpu.json"
PARALLEL = 8


@dataclass(frozen=True)
class Host:
    root: Path
    driver_root: Path
    configmap: Path
    node: Node


@pytest.fixture(scope="module")
def host() -> Iterator[Host]:
    root = Path(tempfile.mkdtemp(prefix="dp-e2e-cdi-"))
    driver_root = root / "host"
    subprocess.run(
        [sys.executable, "-m", "deviceplugin", "sim-root", NODE, str(driver_root)],
        check=True,
        capture_output=True,
    )
    configmap = write_configmap(root / "cm", SEED_CONFIG.format(replicas=2))
    try:
        yield Host(root, driver_root, configmap, read_node(resolve_node_path(NODE)))
    finally:
        subprocess.run(["rm", "-rf", str(root)], check=False)


@dataclass
class Serving:
    kubelet: KubeletEmulator
    cdi_dir: Path
    log: Path


@contextlib.asynccontextmanager
async def serving(host: Host, name: str, *flags: str) -> AsyncIterator[Serving]:
    """`deviceplugin serve` on the simulated node with `flags`, registered with the kubelet
    emulator. On the way out SIGTERM must stop it with exit 0, its sockets removed and a
    written CDI spec left in place (containers started from it may still be running)."""
    directory = Path(tempfile.mkdtemp(prefix=f"dp-{name}-", dir="/tmp"))
    kubelet = KubeletEmulator(directory / "k")
    await kubelet.start()
    log = directory / "serve.log"
    args = [
        *("--simulate", NODE, "--nvidia-driver-root", str(host.driver_root)),
        *("--config-file", str(host.configmap), "--kubelet-dir", str(directory / "k")),
        *("--cdi-spec-dir", str(directory / "cdi"), *flags),
    ]
    with log.open("w") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "deviceplugin", "serve", *args], stderr=output, stdout=output
        )
    try:
        registered = await kubelet.wait_for(
            lambda: all(len(kubelet.devices(r)) == n for r, n in RESOURCES.items()), timeout=30
        )
        assert registered, f"not registered: {log.read_text()}"
        yield Serving(kubelet, directory / "cdi", log)
        spec_written = (directory / "cdi" / SPEC_FILE).exists()
        process.terminate()
        assert process.wait(timeout=30) == 0, log.read_text()
        left = sorted(p.name for p in (directory / "k").iterdir() if p.name != "kubelet.sock")
        assert left == [], f"sockets left after SIGTERM: {left}"
        assert (directory / "cdi" / SPEC_FILE).exists() == spec_written
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        await kubelet.stop()
        subprocess.run(["rm", "-rf", str(directory)], check=False)


async def answers(
    kubelet: KubeletEmulator,
) -> list[tuple[str, api_pb2.ContainerAllocateResponse]]:
    """Every advertised ID, each allocated alone: (id, that container's response)."""
    found = []
    for resource in RESOURCES:
        for device_id in sorted(kubelet.devices(resource)):
            response = await kubelet.allocate(resource, [[device_id]])
            found.append((device_id, response.container_responses[0]))
    return found


def check_all(
    host: Host,
    cdi_dir: Path,
    runs: Sequence[tuple[str, list[str]]],
) -> None:
    """Start one workload per (id, podman args) and compare what each sees with the expected
    nodes of its id; report every mismatch at once."""
    with ThreadPoolExecutor(PARALLEL) as pool:
        results = list(pool.map(lambda run: workload(cdi_dir, run[1]), runs))
    problems = []
    for (device_id, args), result in zip(runs, results, strict=True):
        if result.returncode != 0:
            problems.append(f"{device_id} {args}: exit {result.returncode}: {result.stderr}")
            continue
        seen, wanted = (
            device_nodes(result.stdout),
            expected_nodes(host.driver_root, host.node, device_id),
        )
        if seen != wanted:
            problems.append(f"{device_id} {args}: saw {sorted(seen)}, wanted {sorted(wanted)}")
    assert not problems, "\n".join(problems)


def cdi_run(
    device_id: str, response: api_pb2.ContainerAllocateResponse, via: str
) -> tuple[str, list[str]]:
    if via == "cri":
        names = [device.name for device in response.cdi_devices]
    else:
        (value,) = response.annotations.values()
        names = value.split(",")
    assert len(names) == 1 and names[0].startswith(f"{CDI_KIND}="), (device_id, names)
    return device_id, cdi_args(names)


@pytest.mark.parametrize(
    ("strategy", "id_strategy", "via"),
    [
        ("cdi-cri", "uuid", "cri"),
        ("cdi-annotations", "uuid", "annotation"),
        ("cdi-cri", "index", "cri"),
    ],
)
def test_every_advertised_id_resolves_to_exactly_its_nodes(
    host: Host, strategy: str, id_strategy: str, via: str
) -> None:
    async def body() -> None:
        flags = ("--device-list-strategy", strategy, "--device-id-strategy", id_strategy)
        async with serving(host, strategy, *flags) as plugin:
            assert sorted(p.name for p in plugin.cdi_dir.iterdir()) == [SPEC_FILE]
            runs = [cdi_run(i, r, via) for i, r in await answers(plugin.kubelet)]
            assert len(runs) == sum(RESOURCES.values())
            check_all(host, plugin.cdi_dir, runs)
            unknown = workload(plugin.cdi_dir, cdi_args([f"{CDI_KIND}=no-such-device"]))
            assert unknown.returncode != 0 and "unresolvable CDI devices" in unknown.stderr

    asyncio.run(body())


def test_pass_device_specs_with_envvar_gives_exactly_the_nodes(host: Host) -> None:
    async def body() -> None:
        flags = ("--device-list-strategy", "envvar", "--pass-device-specs", "true")
        async with serving(host, "specs", *flags) as plugin:
            assert not (plugin.cdi_dir / SPEC_FILE).exists()  # no CDI strategy: no spec
            plugin.cdi_dir.mkdir(exist_ok=True)  # the runtime's (empty) CDI directory
            runs = []
            for device_id, response in await answers(plugin.kubelet):
                assert response.envs["NVIDIA_VISIBLE_DEVICES"] == device_id.split("::")[0]
                args = [
                    arg
                    for spec in response.devices
                    for arg in ("--device", f"{spec.host_path}:{spec.container_path}:rwm")
                ]
                runs.append((device_id, args))
            check_all(host, plugin.cdi_dir, runs)

    asyncio.run(body())
