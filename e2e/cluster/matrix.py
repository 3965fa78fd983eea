"""`make e2e-cluster-matrix`: `make e2e-cluster` on every pinned Kubernetes version, one after
the other (one cluster at a time on this machine), each one's exit status, wall time and what its
scenarios observed of each gated feature (`served.observed`) written to run/matrix.json as it
ends, so a run cut short still leaves the versions it finished. A failing version does not stop
the next one; the exit status is 1 if any failed.

`python -m e2e.cluster.matrix --table` prints run/matrix.json as the Markdown table of
docs/dra/versions.md ("Measured"): a row per feature, a column per version."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import TypedDict

from e2e.cluster.kubernetes_version import pinned
from e2e.cluster.layout import REPO, RUN
from e2e.cluster.served import OBSERVED

MATRIX = RUN / "matrix.json"


class Outcome(TypedDict):
    kubernetes: str  # the patch
    exit: int
    seconds: int
    observed: dict[str, str]  # feature -> what the scenarios saw


def main() -> int:
    results: dict[str, Outcome] = {}
    RUN.mkdir(exist_ok=True)
    for version, patch in pinned().items():
        _forget(version)
        started = time.monotonic()
        done = subprocess.run(["make", "e2e-cluster", f"KUBERNETES_VERSION={version}"], cwd=REPO)
        seen = json.loads(OBSERVED.read_text()) if OBSERVED.exists() else {}
        results[version] = {
            "kubernetes": patch,
            "exit": done.returncode,
            "seconds": round(time.monotonic() - started),
            "observed": seen.get(version, {}),
        }
        MATRIX.write_text(json.dumps(results, indent=2) + "\n")
        print(f"e2e-cluster-matrix: {version} ({patch}) exit {done.returncode}", file=sys.stderr)
    return 0 if all(r["exit"] == 0 for r in results.values()) else 1


def _forget(version: str) -> None:
    """Drop what an earlier run observed on `version`, so every cell is this run's."""
    if OBSERVED.exists():
        seen = json.loads(OBSERVED.read_text())
        seen.pop(version, None)
        OBSERVED.write_text(json.dumps(seen, indent=2, sort_keys=True) + "\n")


def table(results: dict[str, Outcome]) -> str:
    """The Markdown table of `results`: a row per observed feature, then the run's outcome."""
    versions = list(results)
    features = sorted({f for r in results.values() for f in r.get("observed", {})})
    header = ["feature", *(f"{v} ({results[v]['kubernetes']})" for v in versions)]
    rows = [
        [feature, *(str(results[v]["observed"].get(feature, "not seen")) for v in versions)]
        for feature in features
    ]
    rows.append(
        [
            "`make e2e-cluster`",
            *(f"exit {results[v]['exit']}, {results[v]['seconds']} s" for v in versions),
        ]
    )
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines.extend("| " + " | ".join(row) + " |" for row in rows)
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:] == ["--table"]:
        print(table(json.loads(MATRIX.read_text())))
        sys.exit(0)
    sys.exit(main())
