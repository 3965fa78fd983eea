"""Which gated DRA features the running cluster serves: its Kubernetes version's default gates
(the stages of docs/dra.md's version table), with `FEATURE_GATES` applied. A scenario whose
feature is not served asserts what the driver does instead (it degrades and names the gate)
rather than what the feature gives; this table is the tests' own, not the driver's probe, so
the probe is checked against it."""

from __future__ import annotations

import json

from e2e.cluster.layout import RUN

# The first minor each gate is on by default.
ON_BY_DEFAULT_FROM = {
    "DRAPartitionableDevices": 36,
    "DRAConsumableCapacity": 36,
    "DRADeviceTaints": 36,
    "DRAExtendedResource": 36,
    "ResourceHealthStatus": 36,
}
# The Kubernetes minor the running cluster was started with (`up` of another one refuses), and
# the gates `FEATURE_GATES` set: both written by `cluster up`.
VERSION_FILE = RUN / "kubernetes-version"
GATES_FILE = RUN / "feature-gates.json"


def version() -> str:
    """The running cluster's minor, `1.35`."""
    return VERSION_FILE.read_text().strip()


def served(gate: str) -> bool:
    """Whether the running cluster has `gate` on."""
    gates = json.loads(GATES_FILE.read_text()) if GATES_FILE.exists() else {}
    if gate in gates:
        return bool(gates[gate])
    return int(version().split(".")[1]) >= ON_BY_DEFAULT_FROM[gate]


OBSERVED = RUN / "observed.json"


def observed(feature: str, what: str) -> None:
    """Record what a scenario saw of `feature` on the running version (run/observed.json): the
    cells of docs/dra/versions.md's measured table, which `make e2e-cluster-matrix` collects."""
    seen = json.loads(OBSERVED.read_text()) if OBSERVED.exists() else {}
    seen.setdefault(version(), {})[feature] = what
    OBSERVED.write_text(json.dumps(seen, indent=2, sort_keys=True) + "\n")
