"""Health, compared: the same NVML event lines fed to NVIDIA's reference plugin and to ours on
the same simulated node. For each scenario, which device IDs each marks Unhealthy at the kubelet
and how long after the line was written, and whether a device comes back once NVML says it
has recovered (docs/compatibility.md, "Health").

    sudo .venv/bin/python -m e2e.reference.health
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from deviceplugin.sim.hostroot import EVENTS_FILE
from deviceplugin.sim.kubelet import KubeletEmulator
from deviceplugin.sim.node import Node, read_node, resolve_node_path
from e2e.reference.advertised import in_turn, wait_registered
from testbed import plugins
from testbed.process import Child

PRESET = "a100-80gb-x8-mixed"  # whole GPUs and MIG devices side by side
CONFIG = {"version": "v1", "flags": {"migStrategy": "mixed"}}
FIRST_MARK_TIMEOUT = 8.0  # the reference waits on NVML events 5 s at a time
SETTLE_SECONDS = 1.0  # after the first change, later marks of the same line
RECOVERY_AFTER = "2"  # ours: re-probe an Unhealthy device after 2 s (default 5 min)
RECOVERY_TIMEOUT = 10.0

Lines = Callable[[Node], list[dict[str, object]]]


@dataclass(frozen=True)
class Scenario:
    name: str
    lines: Lines  # the event lines, given the node
    recover: Lines | None = None  # lines that make NVML report the device healthy again


def whole_gpu(node: Node) -> str:
    return next(gpu.uuid for gpu in node.gpus if not gpu.mig_enabled)


def mig_parent(node: Node) -> str:
    return next(gpu.uuid for gpu in node.gpus if gpu.mig_enabled)


def first_mig(node: Node) -> str:
    parent = next(gpu for gpu in node.gpus if gpu.mig_enabled)
    return parent.mig_devices[0].uuid


SCENARIOS = (
    Scenario(
        "Xid 79 (fallen off the bus) on a whole GPU", lambda n: [{"uuid": whole_gpu(n), "xid": 79}]
    ),
    Scenario(
        "Xid 48 (double-bit ECC) on a whole GPU", lambda n: [{"uuid": whole_gpu(n), "xid": 48}]
    ),
    Scenario(
        "Xid 13 (application error) on a whole GPU", lambda n: [{"uuid": whole_gpu(n), "xid": 13}]
    ),
    Scenario(
        "Xid 94 (contained ECC) on one MIG device", lambda n: [{"uuid": first_mig(n), "xid": 94}]
    ),
    Scenario("Xid 79 on a GPU in MIG mode", lambda n: [{"uuid": mig_parent(n), "xid": 79}]),
    Scenario("GPU lost (every NVML call fails)", lambda n: [{"uuid": whole_gpu(n), "lost": True}]),
    Scenario(
        "Xid 48 with a row remap pending, then the remap done",
        lambda n: [
            {"uuid": whole_gpu(n), "remappedRowsPending": True},
            {"uuid": whole_gpu(n), "xid": 48},
        ],
        recover=lambda n: [{"uuid": whole_gpu(n), "remappedRowsPending": False}],
    ),
)


@dataclass
class Seen:
    """What one plugin did with one scenario."""

    unhealthy: list[str] = field(default_factory=list)
    seconds: float | None = None  # line written -> first device Unhealthy at the kubelet
    recovered_seconds: float | None = None  # recovery line written -> every device Healthy
    failed: str = ""


def _unhealthy(kubelet: KubeletEmulator) -> list[str]:
    return sorted(
        device_id
        for resource in kubelet.resources()
        for device_id, device in kubelet.devices(resource).items()
        if not device.healthy
    )


def _append(events: Path, lines: list[dict[str, object]]) -> float:
    with events.open("a") as out:
        out.write("".join(json.dumps(line) + "\n" for line in lines))
    return time.monotonic()


async def observe(
    kubelet: KubeletEmulator,
    plugin: Child,
    events: Path,
    node: Node,
    scenario: Scenario,
) -> Seen:
    with plugin.start():
        failed = await wait_registered(kubelet, plugin)
        if failed:
            return Seen(failed=failed)
        seen = Seen()
        written = _append(events, scenario.lines(node))
        if await kubelet.wait_for(lambda: bool(_unhealthy(kubelet)), FIRST_MARK_TIMEOUT):
            seen.seconds = time.monotonic() - written
            await asyncio.sleep(SETTLE_SECONDS)
        seen.unhealthy = _unhealthy(kubelet)
        if scenario.recover is not None and seen.unhealthy:
            written = _append(events, scenario.recover(node))
            if await kubelet.wait_for(lambda: not _unhealthy(kubelet), RECOVERY_TIMEOUT):
                seen.recovered_seconds = time.monotonic() - written
        return seen


async def compare_scenario(
    scenario: Scenario, binaries: Path, work: Path, root: Path, node: Node
) -> dict[str, Seen]:
    work.mkdir(parents=True, exist_ok=True)
    config = work / "config.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    events = root / EVENTS_FILE

    async def watch(kubelet: KubeletEmulator, plugin: Child) -> Seen:
        return await observe(kubelet, plugin, events, node, scenario)

    extra = ("--health-recovery-after", RECOVERY_AFTER)
    return await in_turn(binaries, root, config, work, watch, extra)


async def run(
    binaries: Path, scenarios: tuple[Scenario, ...] = SCENARIOS
) -> dict[str, dict[str, Seen]]:
    node = read_node(resolve_node_path(PRESET))
    results: dict[str, dict[str, Seen]] = {}
    with tempfile.TemporaryDirectory(prefix="dp-health-") as temp:
        work = Path(temp)
        for number, scenario in enumerate(scenarios):
            # A fresh node for each scenario: a lost GPU stays lost in the library's state file.
            root = plugins.sim_root(PRESET, work / f"root-{number}")
            results[scenario.name] = await compare_scenario(
                scenario, binaries, work / str(number), root, node
            )
    return results


def _describe(seen: Seen, node: Node) -> str:
    if seen.failed:
        return f"did not serve: {seen.failed}"
    if not seen.unhealthy:
        return "nothing marked"
    kinds = {"MIG": 0, "GPU": 0}
    for device_id in seen.unhealthy:
        kinds["MIG" if device_id.startswith("MIG-") else "GPU"] += 1
    what = ", ".join(f"{count} {kind}" for kind, count in kinds.items() if count)
    timing = f" in {seen.seconds * 1000:.0f} ms" if seen.seconds is not None else ""
    back = ""
    if seen.recovered_seconds is not None:
        back = f"; Healthy again {seen.recovered_seconds:.1f} s after NVML says it is fine"
    elif seen.unhealthy and not seen.failed:
        back = ""
    return f"{what} Unhealthy{timing}{back}"


def table(results: dict[str, dict[str, Seen]]) -> str:
    node = read_node(resolve_node_path(PRESET))
    rows = ["| event line | reference v0.19.0 | ours |", "| --- | --- | --- |"]
    for name, seen in results.items():
        rows.append(
            f"| {name} | {_describe(seen['reference'], node)} | {_describe(seen['ours'], node)} |"
        )
    return "\n".join(rows)


def main() -> int:
    try:
        binaries = plugins.runnable_binaries()
    except plugins.ReferenceUnavailable as exc:
        print(f"health: {exc}", file=sys.stderr)
        return 2
    results = asyncio.run(run(binaries))
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
