"""`make e2e-cluster-matrix`: `make e2e-cluster` on every pinned Kubernetes version, one after
the other (one cluster at a time on this machine), each one's exit status and wall time written
to run/matrix.json as it ends, so a run cut short still leaves the versions it finished. A failing
version does not stop the next one; the exit status is 1 if any failed."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from e2e.cluster.kubernetes_version import pinned
from e2e.cluster.layout import REPO, RUN

MATRIX = RUN / "matrix.json"


def main() -> int:
    results: dict[str, dict[str, object]] = {}
    RUN.mkdir(exist_ok=True)
    for version, patch in pinned().items():
        started = time.monotonic()
        done = subprocess.run(["make", "e2e-cluster", f"KUBERNETES_VERSION={version}"], cwd=REPO)
        results[version] = {
            "kubernetes": patch,
            "exit": done.returncode,
            "seconds": round(time.monotonic() - started),
        }
        MATRIX.write_text(json.dumps(results, indent=2) + "\n")
        print(f"e2e-cluster-matrix: {version} ({patch}) exit {done.returncode}", file=sys.stderr)
    return 0 if all(r["exit"] == 0 for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
