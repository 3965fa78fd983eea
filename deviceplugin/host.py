"""Which host the plugin runs on: the real one, or the simulated node of `--simulate`.

The one place that picks between real NVML and the simulator, and between the real host's files
and a simulated node's, so the node engine and every front-end run the same code on both.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from deviceplugin.model.config import Config
from deviceplugin.model.errors import ConfigError
from deviceplugin.model.hostpaths import host_path
from deviceplugin.node.nvml import Nvml, real_nvml


def open_nvml(simulate: str | None, events_path: str | None = None) -> Nvml:
    """The real NVML library, or with `simulate` (a preset name or node file) the simulator,
    which reads events appended to `events_path`. Not initialised yet: call `init()`."""
    if simulate is None:
        if events_path is not None:
            raise ConfigError("simulateEvents", "simulated events need --simulate")
        return real_nvml()
    from deviceplugin.sim.fake_nvml import FakeNvml  # loaded only when simulating

    sim = FakeNvml(simulate, events_path)
    return Nvml(sim, numa_reader=sim.numa_node)


REAL_PROC_ROOT = "/proc"
DRIVER_ROOT_OVERRIDE = "nvidia_driver_root"


class SimulatedHost:
    """The host files of a simulated node (`sim/hostroot.py`): a directory standing for the
    whole host, so its `proc/` and `dev/` are read where a real node's `/proc` and `/dev`
    would be. A temporary one is removed by `close()`."""

    def __init__(self, root: str, temporary: bool) -> None:
        self.root = root
        self.temporary = temporary

    @property
    def proc_root(self) -> str:
        return host_path(self.root, REAL_PROC_ROOT)

    @property
    def overrides(self) -> dict[str, str | None]:
        """The config overrides that point the driver root at a temporary tree (none for a
        tree the user gave: the config already names it)."""
        return {DRIVER_ROOT_OVERRIDE: self.root} if self.temporary else {}

    def close(self) -> None:
        if self.temporary:
            shutil.rmtree(self.root, ignore_errors=True)


def open_simulated_host(simulate: str | None, config: Config) -> SimulatedHost | None:
    """None on a real node. Under `--simulate`, the config's driver root is the simulated host
    when one is set (a tree made with `deviceplugin sim-root`); otherwise the node's tree is
    laid out in a new temp dir, removed by `close()`."""
    if simulate is None:
        return None
    if config.flags.nvidia_driver_root != "/":
        return SimulatedHost(config.flags.nvidia_driver_root, temporary=False)
    from deviceplugin.sim.hostroot import lay_out  # loaded only when simulating
    from deviceplugin.sim.node import read_node, resolve_node_path

    node = read_node(resolve_node_path(simulate))
    root = tempfile.mkdtemp(prefix="dp-simhost-")
    try:
        lay_out(node, Path(root), every_instance=False)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return SimulatedHost(root, temporary=True)


def proc_root(host: SimulatedHost | None) -> str:
    """Where the kernel module's files are read: the simulated host's, or the real `/proc`."""
    return host.proc_root if host is not None else REAL_PROC_ROOT
