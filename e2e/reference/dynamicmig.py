"""Dynamic MIG: NVIDIA's DRA kubelet plugin (`gpu-kubelet-plugin` v0.4.1, `DynamicMIG=true`) as
the oracle for `dra serve --mig-mode dynamic`, on the same simulated node.

Each driver runs alone on a fresh driver root of the preset (`sim-root`), against an API-server
stand-in and a plugin-watcher emulator of its own, as bench/drareference.py runs them. Once its
pool is complete, one claim allocated PARTITION is prepared through the kubelet's DRA socket,
and what the simulated library then holds (GPU instances with their compute instances, MIG mode)
is read back by a fresh Python process through nvidia-ml-py; then it is unprepared and read
back again.

    sudo .venv/bin/python -m e2e.reference.dynamicmig [-v]

compares the two: the counter sets and their counters, the device names, each device's counter
consumption and capacities, and the instances the claim leaves. Every difference is either a
documented one (KNOWN, docs/compatibility.md "Dynamic MIG") or unexplained, exit status 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deviceplugin.model.quantity import parse_quantity
from deviceplugin.sim.apiserver import ApiServer
from deviceplugin.sim.pluginwatcher import PluginWatcher
from e2e.reference.known import Difference, Known
from testbed import kubeproto, plugins
from testbed.process import Child
from testbed.simnvml import mig_layout

PRESET = "a100-80gb-x8-dynamic"  # eight A100 80GB, MIG mode on, no instance
NODE = "dmig-node"
DRIVER = "gpu.nvidia.com"
NAMESPACE = "dmig"
PARTITION = "gpu-0-mig-3g40gb-9-4"  # a 3g.40gb at memory slices 4-7 of GPU 0: both publish it
OURS, REFERENCE = "ours", "reference"
TIMEOUT = 60.0
MIG_ENABLED = 1  # NVML_DEVICE_MIG_ENABLE
POLL = 0.05

Json = dict[str, Any]
Decode = Callable[[bytes], Json]


@dataclass
class Outcome:
    """What one driver published and what its Prepare and Unprepare left."""

    slices: list[Json]
    prepared: list[str] = field(default_factory=list)  # the devices NodePrepareResources named
    error: str = ""  # its error for the claim, if any
    cut: Json = field(default_factory=dict)  # read back after Prepare
    left: Json = field(default_factory=dict)  # read back after Unprepare
    unprepare_error: str = ""


def read_back(root: Path) -> Json:
    """The simulated library's MIG layout: every GPU's GPU instances, each with its compute
    instances, and its MIG mode (GPUs in MIG mode with no instance left out)."""
    layout: Json = {}
    for gpu in mig_layout(root):
        found = [
            {
                "profileId": gi["profileId"],
                "placement": gi["placement"],
                "computeInstances": [
                    {"profileId": ci["profileId"], "placement": ci["placement"]}
                    for ci in gi["computeInstances"]
                ],
            }
            for gi in gpu["gpuInstances"]
        ]
        if found or gpu["migMode"] != MIG_ENABLED:
            instances = sorted(found, key=json.dumps)
            layout[f"gpu-{gpu['index']}"] = {"migMode": gpu["migMode"], "gpuInstances": instances}
    return layout


def pool_complete(server: ApiServer) -> bool:
    """Whether every slice of the newest generation of the node's pool is at the stand-in."""
    pools = [s["spec"]["pool"] for s in server.slices.values()]
    if not pools:
        return False
    newest = max(p["generation"] for p in pools)
    counts = [int(p["resourceSliceCount"]) for p in pools if p["generation"] == newest]
    return len(counts) == counts[0]


def allocated(name: str, device: str) -> Json:
    """A ResourceClaim as the scheduler leaves it: one request, allocated `device`."""
    request = {"name": "mig", "exactly": {"deviceClassName": DRIVER}}
    result = {"request": "mig", "driver": DRIVER, "pool": NODE, "device": device}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"devices": {"requests": [request]}},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }


def _child(name: str, work: Path, root: Path, binaries: Path, kubeconfig: Path) -> Child:
    log, cdi, kubelet = work / f"{name}.log", work / "cdi", work / "kubelet"
    if name == REFERENCE:
        return plugins.dra_driver(
            binaries, root, kubeconfig, NODE, cdi, log, kubelet, ["--feature-gates=DynamicMIG=true"]
        )
    return plugins.ours_dra(root, kubeconfig, NODE, cdi, kubelet, log, ["--mig-mode", "dynamic"])


@contextlib.asynccontextmanager
async def _running(
    name: str, work: Path, binaries: Path, decode: Decode
) -> AsyncIterator[tuple[ApiServer, PluginWatcher, Path]]:
    """The driver on a fresh driver root, registered and its pool complete."""
    root = plugins.sim_root(PRESET, work / "root")
    server = ApiServer(decoders={kubeproto.CONTENT_TYPE: decode})
    await server.start()
    server.add_node(NODE)
    watcher = PluginWatcher(work / "kubelet", poll=POLL)
    await watcher.start()
    child = _child(
        name, work, root, binaries, plugins.write_kubeconfig(work / "kubeconfig", server.url)
    )
    try:
        with child.start():
            deadline = time.monotonic() + TIMEOUT
            while not (DRIVER in watcher.plugins and pool_complete(server)):
                if not child.alive() or time.monotonic() > deadline:
                    raise RuntimeError(f"{name}: not registered and published:\n{child.tail()}")
                await asyncio.sleep(POLL)
            yield server, watcher, root
    finally:
        await watcher.stop()
        await server.stop()


async def drive(name: str, work: Path, binaries: Path, decode: Decode) -> Outcome:
    """Run one driver: its slices, then PARTITION prepared, read back, unprepared, read back."""
    async with _running(name, work, binaries, decode) as (server, watcher, root):
        outcome = Outcome(slices=[json.loads(json.dumps(s)) for s in server.slices.values()])
        meta = server.add_claim(allocated("partition", PARTITION))["metadata"]
        ref = (NAMESPACE, meta["name"], meta["uid"])
        answer = (await watcher.prepare(DRIVER, [ref])).claims[meta["uid"]]
        outcome.error = answer.error
        outcome.prepared = sorted(d.device_name for d in answer.devices)
        outcome.cut = read_back(root)
        unprepared = (await watcher.unprepare(DRIVER, [ref])).claims[meta["uid"]]
        outcome.unprepare_error = unprepared.error
        outcome.left = read_back(root)
        return outcome


async def run(binaries: Path) -> dict[str, Outcome]:
    """Both drivers, one after the other, each on a driver root of its own."""
    decode = kubeproto.decoder(kubeproto.module_dirs())
    with tempfile.TemporaryDirectory(prefix="dmig-") as scratch:
        return {
            name: await drive(name, Path(scratch) / name, binaries, decode)
            for name in (OURS, REFERENCE)
        }


# --- the comparison ---------------------------------------------------------------------------


def _amounts(counters: Json) -> dict[str, int]:
    return {name: parse_quantity(str(c["value"])) for name, c in counters.items()}


def counter_sets(slices: Iterable[Json]) -> dict[str, dict[str, int]]:
    """Counter set name -> counter -> value."""
    return {
        s["name"]: _amounts(s["counters"])
        for piece in slices
        for s in piece["spec"].get("sharedCounters") or []
    }


def devices(slices: Iterable[Json]) -> dict[str, Json]:
    """Device name -> what is compared of it: what it consumes, its capacities, and its
    attributes as `{domain}/{name}` -> value."""
    found = {}
    for piece in slices:
        for device in piece["spec"].get("devices") or []:
            consumes = {
                c["counterSet"]: _amounts(c["counters"])
                for c in device.get("consumesCounters") or []
            }
            attributes = {
                (key if "/" in key else f"{DRIVER}/{key}"): next(iter(value.values()))
                for key, value in (device.get("attributes") or {}).items()
            }
            found[device["name"]] = {
                "consumesCounters": consumes,
                "capacity": _amounts(device.get("capacity") or {}),
                "attributes": attributes,
            }
    return found


def layout(slices: Iterable[Json]) -> Json:
    """How the pool is cut: slices holding counter sets, and how many devices each other holds."""
    specs = [piece["spec"] for piece in slices]
    return {
        "counterSlices": sum(1 for spec in specs if spec.get("sharedCounters")),
        "deviceSlices": sorted(len(spec["devices"]) for spec in specs if spec.get("devices")),
    }


def _nvidias_attributes(ours: dict[str, Json], ref: dict[str, Json]) -> None:
    """Keep, of every device both publish, only the attributes NVIDIA's sets: ours may carry
    more (docs/dra/dynamic-mig.md), but each of NVIDIA's must be there with the same value."""
    for name in set(ours) & set(ref):
        ours[name]["attributes"] = {
            key: ours[name]["attributes"].get(key) for key in ref[name]["attributes"]
        }


def _diff(case: str, path: str, ours: Any, reference: Any) -> list[Difference]:
    """Leaf by leaf; a key only one side has is a difference at that key."""
    if isinstance(ours, dict) and isinstance(reference, dict):
        return [
            d
            for key in sorted(set(ours) | set(reference))
            for d in _diff(case, f"{path}.{key}", ours.get(key), reference.get(key))
        ]
    return [] if ours == reference else [Difference(case, path.lstrip("."), ours, reference)]


def compare(outcomes: dict[str, Outcome]) -> list[Difference]:
    """Every difference between the two drivers' slices and claim."""
    ours, ref = outcomes[OURS], outcomes[REFERENCE]
    case = f"dynamic MIG on {PRESET}"
    ours_devices, ref_devices = devices(ours.slices), devices(ref.slices)
    _nvidias_attributes(ours_devices, ref_devices)
    return [
        *_diff(case, "layout", layout(ours.slices), layout(ref.slices)),
        *_diff(case, "counterSets", counter_sets(ours.slices), counter_sets(ref.slices)),
        *_diff(case, "devices", ours_devices, ref_devices),
        *_diff(case, "prepare.devices", ours.prepared, ref.prepared),
        *_diff(case, "prepare.error", ours.error, ref.error),
        *_diff(case, "prepare.cut", ours.cut, ref.cut),
        *_diff(case, "unprepare.error", ours.unprepare_error, ref.unprepare_error),
        *_diff(case, "unprepare.left", ours.left, ref.left),
    ]


def _ours_only(ours: Any, reference: Any) -> bool:
    return ours is not None and reference is None


def _reference_only(ours: Any, reference: Any) -> bool:
    return ours is None and reference is not None


def _at_most_64_per_slice(ours: Any, reference: Any) -> bool:
    return isinstance(ours, list) and max(ours) <= 64 < sum(ours)


# docs/compatibility.md, "Dynamic MIG: ours and NVIDIA's DRA driver", one heading per entry.
KNOWN: tuple[Known, ...] = (
    Known("The whole GPU in MIG mode: only ours", r"devices\.gpu-\d+", check=_ours_only),
    Known(
        "`brand`: only NVIDIA's",
        r"devices\.gpu-\d+-mig-.*\.attributes\.gpu\.nvidia\.com/brand",
        check=_reference_only,
    ),
    Known(
        "Device slices: 64 devices each, not one per GPU",
        r"layout\.deviceSlices",
        check=_at_most_64_per_slice,
    ),
)


def explain(difference: Difference) -> Known | None:
    """The documented entry covering this difference, if any."""
    return next((known for known in KNOWN if known.covers(difference)), None)


def main(argv: list[str]) -> int:
    verbose = "-v" in argv
    binaries = plugins.runnable_binaries()
    outcomes = asyncio.run(run(binaries))
    differences = compare(outcomes)
    unexplained = [d for d in differences if explain(d) is None]
    by_title: dict[str, int] = {}
    for d in differences:
        known = explain(d)
        if known is not None:
            by_title[known.title] = by_title.get(known.title, 0) + 1
    for name, outcome in outcomes.items():
        sets, devs = counter_sets(outcome.slices), devices(outcome.slices)
        print(
            f"{name}: {len(outcome.slices)} slices, {len(sets)} counter sets, {len(devs)} devices"
        )
        got = outcome.prepared or outcome.error
        print(f"  {PARTITION} prepared as {got}, cut {json.dumps(outcome.cut)}")
        print(f"  unprepared: {outcome.unprepare_error or 'left ' + json.dumps(outcome.left)}")
    for title, count in by_title.items():
        print(f"  documented: {title}: {count} fields")
    for d in unexplained if not verbose else differences:
        print(f"  {'UNEXPLAINED ' if explain(d) is None else ''}{d}")
    return 1 if unexplained else 0


if __name__ == "__main__":
    if os.geteuid() != 0:
        sys.exit("needs root: NVIDIA's driver runs in a mount namespace")
    sys.exit(main(sys.argv[1:]))
