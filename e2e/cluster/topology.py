"""How many nodes the cluster runs: `NODES` (1, the default, or 2), and the simulated node the
second one is (`NODE2_PRESET`, a preset of deviceplugin/sim/presets or a node file, default
a10-x8). `cluster up` refuses anything else with exit 2, naming what it accepts, and records what
it started in run/nodes, which the scenarios read to know how many nodes there are."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from e2e.cluster.kubernetes_version import BadInput
from e2e.cluster.layout import NODES, REPO, RUN, Node

ACCEPTED = tuple(str(node.number) for node in NODES)
DEFAULT_SECOND_PRESET = "a10-x8"
PRESETS = REPO / "deviceplugin" / "sim" / "presets"
NODES_FILE = RUN / "nodes"
SECOND_PRESET_FILE = RUN / "node2-preset"


@dataclass(frozen=True)
class Topology:
    count: int
    second_preset: str  # the simulated node of node 2 (kept, unused, with one node)

    @property
    def nodes(self) -> tuple[Node, ...]:
        return NODES[: self.count]


def asked(environ: Mapping[str, str]) -> Topology:
    """The topology `NODES` and `NODE2_PRESET` ask for; empty or unset means the default."""
    count = environ.get("NODES", "").strip() or "1"
    if count not in ACCEPTED:
        accepted = " ".join(ACCEPTED)
        raise BadInput(f"NODES={count!r} is not accepted; accepted: {accepted} (default 1)")
    preset = environ.get("NODE2_PRESET", "").strip() or DEFAULT_SECOND_PRESET
    if Path(preset).is_file():  # a node file, named wherever `cluster` runs from
        preset = str(Path(preset).resolve())
    elif not (PRESETS / f"{preset}.yaml").is_file():
        names = " ".join(sorted(p.stem for p in PRESETS.glob("*.yaml")))
        raise BadInput(f"NODE2_PRESET={preset!r} is neither a preset ({names}) nor a node file")
    return Topology(int(count), preset)


def record(topology: Topology) -> None:
    NODES_FILE.write_text(f"{topology.count}\n")
    SECOND_PRESET_FILE.write_text(topology.second_preset + "\n")


def recorded() -> Topology:
    """What the last `cluster up` started (one node if it never ran)."""
    count = int(NODES_FILE.read_text()) if NODES_FILE.exists() else 1
    preset = (
        SECOND_PRESET_FILE.read_text().strip()
        if SECOND_PRESET_FILE.exists()
        else DEFAULT_SECOND_PRESET
    )
    return Topology(count, preset)
