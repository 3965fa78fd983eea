"""`python -m bench` (`make bench`): measure the real `deviceplugin serve` process on simulated
nodes against baselines taken in the same run, print one table, write bench/results.json.

Targets are goals: a slow machine prints "miss" and still exits 0. The exit code is 1 only when
a measure could not be taken at all (the plugin broke). Everything runs in sequence, so the
figures do not compete with each other for the CPUs; every process and temp dir is cleaned up.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

from bench import (
    cdi,
    dra,
    drastart,
    dynamicmig,
    migprepare,
    migration,
    preferred,
    process,
    scenarios,
)
from bench.report import Figure, table, write_json

RESULTS = Path(__file__).parent / "results.json"
GROUP_TIMEOUT = 150.0  # a hung plugin must not hang `make bench`; a group takes about 30 s

Group = Callable[[Path], Awaitable[list[Figure]]]
GROUPS: list[tuple[str, Group]] = [
    ("start-up", scenarios.startup),
    ("dra serve: start-up and memory against its floor", drastart.run),
    ("default node: idle, Allocate, events, reloads", scenarios.default_node_figures),
    ("large node: preferred allocation over gRPC", scenarios.large_node_figures),
    ("DRA: publishing 64 GPUs x 7 MIG, Prepare and Unprepare", dra.run),
    ("DRA: publishing 8 A100 in dynamic MIG mode", dynamicmig.run),
    ("DRA: Prepare cutting a dynamic MIG partition", migprepare.run),
    ("CDI: the spec of 64 GPUs x 7 MIG", cdi.run),
    ("DRA: a node mid-migration, a GPU a device plugin's pod holds", migration.run),
]


async def _measure(root: Path) -> list[Figure]:
    figures: list[Figure] = []
    for name, group in GROUPS:
        print(f"bench: {name} ...", file=sys.stderr, flush=True)
        try:
            figures += await asyncio.wait_for(group(root), GROUP_TIMEOUT)
        except Exception as exc:  # report what broke and go on with the other groups
            figures.append(Figure(name, None, "", error=f"{type(exc).__name__}: {exc}"))
    return figures


def _preferred() -> list[Figure]:
    """The pure-function microbenchmark, its yardstick as the baseline."""
    print("bench: preferred allocation, pure function ...", file=sys.stderr, flush=True)
    return [
        Figure(
            f"pure preferred of 8, {name} ({row['ids']:.0f} IDs), median",
            row["median_ms"],
            "ms",
            baseline=row["baseline_median_ms"],
            baseline_label="sort of 1,792 IDs",
        )
        for name, row in preferred.run().items()
    ]


def main() -> int:
    began = time.monotonic()
    stamp = datetime.now(UTC).isoformat(timespec="seconds")
    root = Path(tempfile.mkdtemp(prefix="dpb"))
    process.compile_sources()
    try:
        figures = asyncio.run(_measure(root))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    figures += _preferred()
    duration = time.monotonic() - began
    print(table(figures))
    for figure in figures:
        if figure.error:
            print(f"\n{figure.measure}: {figure.error}", file=sys.stderr)
    print(f"\n{duration:.0f} s; figures with samples in {RESULTS}")
    write_json(RESULTS, figures, {"started": stamp, "duration_s": round(duration, 1)})
    return 1 if any(f.error for f in figures) else 0


if __name__ == "__main__":
    sys.exit(main())
