"""Which host the plugin runs on: the real one, or a simulated node.

The one place that picks between real NVML and the simulator, and between the real host's files
and a simulated node's, so the node engine and every front-end run the same code on both. The
simulator of `--simulate` is built by the composition and handed down as a `Simulator`: nothing
here imports it. Without one, a driver root is a simulated host only when `sim-root` marked it
so (`node.simmarker`), never because of the files it holds.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

from deviceplugin.model.config import Config, ParsedConfig
from deviceplugin.model.errors import ConfigError
from deviceplugin.model.hostpaths import host_path
from deviceplugin.model.log import log_event
from deviceplugin.node.nvml import Nvml, real_nvml
from deviceplugin.node.simmarker import is_sim_root
from deviceplugin.runtime import scratch


class Simulator(Protocol):
    """What the engine needs of the simulated node `--simulate` names (`sim.simulator`)."""

    def open_nvml(self, events_path: str | None) -> Nvml:
        """Its NVML, reading events appended to `events_path`; not initialised yet."""
        ...

    def lay_out(self, directory: Path) -> None:
        """Write its host tree (`dev/`, `proc/`, driver files) under `directory`."""
        ...

    def lay_out_proc(self, directory: Path) -> None:
        """Write only the kernel module's files (mig-minors, majors) under `directory`."""
        ...


def open_nvml(
    simulator: Simulator | None, events_path: str | None = None, driver_root: str = "/"
) -> Nvml:
    """The real NVML library (the `libnvidia-ml.so.1` under `driver_root` when it has one), or
    the `simulator`'s, which reads events appended to `events_path`. Not initialised yet: call
    `init()`."""
    if simulator is None:
        if events_path is not None:
            raise ConfigError("simulateEvents", "simulated events need --simulate")
        return real_nvml(driver_root)
    return simulator.open_nvml(events_path)


logger = logging.getLogger(__name__)

REAL_PROC_ROOT = "/proc"
DRIVER_ROOT_OVERRIDE = "nvidia_driver_root"


class SimulatedHost:
    """The host files of a simulated node (`sim/hostroot.py`): a directory standing for the
    whole host, so its `proc/` and `dev/` are read where a real node's `/proc` and `/dev`
    would be. `proc` overrides where the kernel module's files are read (a tree without a
    `proc/`); `temporary` paths are removed by `close()`."""

    def __init__(self, root: str, temporary: bool, proc: str | None = None) -> None:
        self.root = root
        self.temporary = temporary
        self._proc = proc

    @property
    def proc_root(self) -> str:
        return self._proc or host_path(self.root, REAL_PROC_ROOT)

    @property
    def overrides(self) -> dict[str, str | None]:
        """The config overrides that point the driver root at a temporary tree (none for a
        tree the user gave: the config already names it)."""
        return {DRIVER_ROOT_OVERRIDE: self.root} if self.temporary else {}

    def close(self) -> None:
        if self.temporary:
            scratch.release(self.root)
        if self._proc is not None:
            scratch.release(self._proc)


def open_simulated_host(simulator: Simulator | None, config: Config) -> SimulatedHost | None:
    """None on a real node. With a `simulator`, the config's driver root is the simulated host
    when one is set (a tree made with `deviceplugin sim-root`; one with no `proc/` gets the
    simulated kernel module's files in a temp dir); otherwise the node's tree is laid out in a
    new temp dir. Without one, a driver root that `sim-root` marked as its own (where the
    simulated libnvidia-ml serves NVML) is the simulated host too: no runtime lets a container
    mount its kernel module's files over its /proc. `close()` removes what was made."""
    root = config.flags.nvidia_driver_root
    if simulator is None:
        simulated = root != "/" and is_sim_root(root)
        return SimulatedHost(root, temporary=False) if simulated else None
    if root != "/":
        if os.path.isdir(host_path(root, REAL_PROC_ROOT)):
            return SimulatedHost(root, temporary=False)
        return SimulatedHost(root, temporary=False, proc=scratch.make(simulator.lay_out_proc))
    return SimulatedHost(scratch.make(simulator.lay_out), temporary=True)


Overrides = Mapping[str, str | None]


def open_host_config(
    simulator: Simulator | None, overrides: Overrides, parse: Callable[[Overrides], ParsedConfig]
) -> tuple[ParsedConfig, SimulatedHost | None, Overrides]:
    """The config `parse(overrides)` gives, and on a simulated node its host files; when the
    simulator laid out a temporary tree, the config parsed again with that tree as its driver
    root. Also the overrides in force, for later reloads. Without a writable temp dir (a
    read-only root with no /tmp) there is no simulated host: that is logged, and the real
    host's files are read as before."""
    parsed = parse(overrides)
    try:
        host = open_simulated_host(simulator, parsed.config)
    except OSError as exc:
        log_event(
            logger,
            "simulate.host_files_unavailable",
            logging.WARNING,
            error=f"{exc.filename or ''}: {exc.strerror or exc}",
            hint="reading host files from the real /proc and driver root instead",
        )
        return parsed, None, overrides
    if host is None or not host.overrides:
        return parsed, host, overrides
    merged = {**overrides, **host.overrides}
    return parse(merged), host, merged


def proc_root(host: SimulatedHost | None) -> str:
    """Where the kernel module's files are read: the simulated host's, or the real `/proc`."""
    return host.proc_root if host is not None else REAL_PROC_ROOT
