"""The simulated node of `--simulate`, as the node engine needs it (`runtime.host.Simulator`):
its NVML (`fake_nvml`) and its host tree (`hostroot`).

Built by the composition (the top level, the demos, the dry-run commands) and handed down, so
the runtime never imports the simulator. Its modules load on first use, so a command that
imports this one (`cdi-spec`, `inspect`) loads none of them on a real node.
"""

from __future__ import annotations

from pathlib import Path

from deviceplugin.node.nvml import Nvml


class NodeSimulator:
    """The node a preset name or node file (`source`) describes."""

    def __init__(self, source: str) -> None:
        self.source = source

    def open_nvml(self, events_path: str | None) -> Nvml:
        from deviceplugin.sim.fake_nvml import FakeNvml

        fake = FakeNvml(self.source, events_path)
        return Nvml(fake, numa_reader=fake.numa_node)

    def lay_out(self, directory: Path) -> None:
        """Only the capability nodes of the MIG devices the node has now: a temporary tree is
        laid out at every start."""
        from deviceplugin.sim.hostroot import lay_out
        from deviceplugin.sim.node import read_node_once, resolve_node_path

        lay_out(read_node_once(resolve_node_path(self.source)), directory, every_instance=False)

    def lay_out_proc(self, directory: Path) -> None:
        from deviceplugin.sim.hostroot import lay_out_proc

        lay_out_proc(directory)


def simulator_for(source: str | None) -> NodeSimulator | None:
    """The simulator of `--simulate SOURCE`; None on a real node."""
    return None if source is None else NodeSimulator(source)
