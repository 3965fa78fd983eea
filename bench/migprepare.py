"""Prepare of a claim that cuts one dynamic MIG partition (issue 42: p50 <= 50 ms), against the
static mode's Prepare of a MIG device that already exists, taken in the same run.

Both on the simulated libnvidia-ml.so.1 of a driver root laid out as `deviceplugin sim-root`
lays it out (the production NVML path; the Python fake cannot cut), the real `dra serve` driver
in-process, registered with the plugin-watcher emulator, one NodePrepareResources per new claim
of one device over the DRA socket, the claims read from the API-server stand-in.

Dynamic: preset a100-80gb-x8-dynamic (MIG on, no instance); each claim is one `1g.10gb`
partition, the 56 placements of the 8 GPUs in turn, so every Prepare checkpoints the intended
partition, creates its GPU and compute instance through the library (under the root's lock
file), checkpoints the ids, writes the CDI spec and checkpoints the claim complete. Static (the
baseline): preset a100-80gb-x8-mixed, a claim for each of its 28 MIG devices: checkpoint, CDI
spec, checkpoint. After each round every claim is unprepared (the partitions destroyed), so the
next round cuts the same placements again.
`python -m bench.migprepare` prints the figures; `run(root)` returns them.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from bench.dra import DRIVER, NODE, prepare_each
from bench.report import Figure, median, p95
from deviceplugin.dra.driver import DraDriver
from deviceplugin.model.migpartitions import MigMode
from deviceplugin.runtime.options import DraServeOptions
from deviceplugin.sim.apiserver import ApiServer
from deviceplugin.sim.hostroot import install_library, lay_out
from deviceplugin.sim.libbuild import library_path
from deviceplugin.sim.node import read_node, resolve_node_path
from deviceplugin.sim.pluginwatcher import PluginWatcher
from testbed.plugins import write_kubeconfig

DYNAMIC_PRESET = "a100-80gb-x8-dynamic"
STATIC_PRESET = "a100-80gb-x8-mixed"
ROUNDS = 3
TARGET_MS = 50.0
ONE_G = "-mig-1g10gb-19-"  # 1g.10gb (profile 19), not 1g.10gb+me: gpu-<minor>-mig-1g10gb-19-<start>


def driver_root(preset: str, root: Path) -> Path:
    """A fresh driver root of `preset` with the simulated library, as `sim-root` writes it."""
    node = read_node(resolve_node_path(preset))
    lay_out(node, root)
    install_library(node, root, library_path())
    return root


async def prepares(root: Path, mig_mode: MigMode, pick: str) -> list[float]:
    """Seconds per Prepare of a new claim of one device, for every published device whose name
    holds `pick`, ROUNDS times (each round unprepared before the next)."""
    preset = DYNAMIC_PRESET if mig_mode == "dynamic" else STATIC_PRESET
    root.mkdir(parents=True)
    server = ApiServer()
    await server.start()
    settings = DraServeOptions(
        cdi_spec_dir=root / "cdi",
        kubelet_root=root / "kubelet",
        kubeconfig=str(write_kubeconfig(root / "kubeconfig", server.url)),
        node_name=NODE,
        mig_mode=mig_mode,
        overrides={"nvidia_driver_root": str(driver_root(preset, root / "driver"))},
    )
    driver = DraDriver(settings)
    watcher = PluginWatcher(settings.kubelet_root)
    times: list[float] = []
    try:
        await driver.start()
        if driver.publisher is None:
            raise RuntimeError("the driver started no publisher")
        await asyncio.wait_for(driver.publisher.wait_published(), 30)  # every slice, not the first
        await watcher.start()
        await watcher.wait_registered(DRIVER)
        names = [
            d["name"]
            for s in server.slices.values()
            for d in (s["spec"].get("devices") or [])
            if pick in d["name"]
        ]
        if not names:
            raise RuntimeError(f"no published device of {preset} names {pick!r}")
        for round_ in range(ROUNDS):
            refs, took = await prepare_each(server, watcher, names, f"c{round_}")
            times.extend(took)
            for ref in refs:
                answer = await watcher.unprepare(DRIVER, [ref])
                if answer.claims[ref[2]].error:
                    raise RuntimeError(f"Unprepare failed: {answer.claims[ref[2]].error}")
        return times
    finally:
        await watcher.stop()
        await driver.stop()
        await server.stop()


async def run(root: Path) -> list[Figure]:
    """p50 and p95 of the cutting Prepare, each against the static Prepare's of the same run."""
    static = [t * 1000 for t in await prepares(root / "static", "static", "-mig-")]
    dynamic = [t * 1000 for t in await prepares(root / "dynamic", "dynamic", ONE_G)]
    label = f"static mode's Prepare of an existing MIG device ({STATIC_PRESET}), same statistic"
    return [
        Figure(
            f"DRA dynamic MIG Prepare cutting one 1g.10gb (8 A100), p50 of {len(dynamic)}",
            median(dynamic),
            "ms",
            target=TARGET_MS,
            baseline=median(static),
            baseline_label=label,
            samples=dynamic,
        ),
        Figure(
            "DRA dynamic MIG Prepare cutting one 1g.10gb, p95",
            p95(dynamic),
            "ms",
            baseline=p95(static),
            baseline_label=label,
        ),
    ]


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="dpb-migprep") as root:
        for figure in asyncio.run(run(Path(root))):
            value, baseline = figure.value or 0.0, figure.baseline or 0.0
            ratio = value / baseline if baseline else 0.0
            print(
                f"{figure.measure}: {value:.2f} {figure.unit} (baseline {baseline:.2f}"
                f" {figure.unit}, {ratio:.2f}x) {figure.result}"
            )


if __name__ == "__main__":
    main()
