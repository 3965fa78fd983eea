"""Building the CDI spec for the largest node we plan for: 64 A100s cut into seven 1g.10gb MIG
devices each (513 CDI devices with `all`), with the device nodes and mig-minors of a simulated
host laid out in a temp dir (the driver's table stops at 32 GPUs; the bench extends it by the
same formula, so all 64 resolve).

Two figures, each next to a baseline taken in the same run: the pure build (inventory + host
scan -> spec), against serialising the finished spec with `json.dumps` (the least any writer
must do with a document of that size); and the whole sync `serve` does on a change (scan the
host, build, render, atomic write), against writing the same bytes with one `write_bytes`.
`python -m bench.cdi` prints the figures; `run(root)` returns them.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.dra import discover_node, write_node
from bench.report import Figure, median
from deviceplugin.model.cdi import CdiOptions, build_spec
from deviceplugin.model.hostpaths import MIG_MINORS
from deviceplugin.node.cdiwriter import SpecWriter, render
from deviceplugin.node.hostscan import scan_host
from deviceplugin.sim.hostroot import gpu_instance_minor, lay_out
from deviceplugin.sim.node import read_node

REPEATS = 21
TARGET_MS = 50.0


def _timed(action: Callable[[], object]) -> list[float]:
    samples = []
    for _ in range(REPEATS):
        started = time.perf_counter()
        action()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def measure(root: Path) -> list[Figure]:
    node_file = write_node(root / "node.yaml")
    inventory = discover_node(node_file)
    host = root / "host"
    lay_out(read_node(node_file), host)
    _extend_mig_minors(host / "proc" / MIG_MINORS, len(inventory.gpus))
    options = CdiOptions(driver_root=str(host), dev_root=str(host))
    scan = scan_host(inventory.driver_version, str(host), str(host), str(host / "proc"))
    spec = build_spec(inventory, scan, options)
    build = _timed(lambda: build_spec(inventory, scan, options))
    dumps = _timed(lambda: json.dumps(spec, indent=2))

    writer = SpecWriter(root / "cdi" / "spec.json")
    flip = [0]

    def sync() -> None:
        fresh = scan_host(inventory.driver_version, str(host), str(host), str(host / "proc"))
        built = build_spec(inventory, fresh, options)
        flip[0] ^= 1  # a changed spec every time, so every sample really writes
        built["devices"][-1]["containerEdits"]["env"] = [f"BENCH={flip[0]}"]
        writer.write(built)

    content = render(spec)
    plain = root / "plain.json"
    synced = _timed(sync)
    written = _timed(lambda: plain.write_bytes(content))
    devices = len(spec["devices"])
    return [
        Figure(
            f"CDI spec build, {devices} devices, median",
            median(build),
            "ms",
            target=TARGET_MS,
            baseline=median(dumps),
            baseline_label="json.dumps of the spec",
            samples=build,
        ),
        Figure(
            f"CDI spec sync (scan, build, atomic write, {len(content) // 1024} KiB), median",
            median(synced),
            "ms",
            baseline=median(written),
            baseline_label="one write_bytes of it",
            samples=synced,
        ),
    ]


def _extend_mig_minors(path: Path, gpus: int) -> None:
    lines = []
    for gpu in range(32, gpus):
        for gi in range(15):
            access = gpu_instance_minor(gpu, gi)
            lines.append(f"gpu{gpu}/gi{gi}/access {access}\n")
            lines.extend(f"gpu{gpu}/gi{gi}/ci{ci}/access {access + 1 + ci}\n" for ci in range(8))
    with path.open("a") as file:
        file.writelines(lines)


async def run(root: Path) -> list[Figure]:
    """The bench group: the measures off the event loop (they are synchronous)."""
    directory = root / "cdi-bench"
    directory.mkdir()
    return await asyncio.to_thread(measure, directory)


def main() -> None:
    from bench.report import table

    with tempfile.TemporaryDirectory(prefix="dpb") as root:
        print(table(measure(Path(root))))


if __name__ == "__main__":
    main()
