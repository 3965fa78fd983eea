"""What the MPS control daemons of one plugin's run were told, read from the simulated control
daemon's own records, so that NVIDIA's `mps-control-daemon` and ours are compared by what
reached the daemon rather than by what either says it sent:

- each daemon's `control.log` (`<mps root>/<resource>/log/`): the `Cmd:<command>` lines, the
  limits it was told as a sorted list (NVIDIA's daemon sends the per-device limits in Go map
  order, so only the multiset is stable) and the other commands as a set (health checks repeat
  as often as a plugin checks);
- the limits in effect (`deviceplugin-sim-mps.json` in the pipe directory, without the pid);
- each device's compute mode, as the simulated NVML keeps it for every process of the node;
- once the plugin (and NVIDIA's daemon) has stopped: the compute modes again, and which control
  daemons still hold limits (a daemon told `quit` removes its file).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from deviceplugin.sim.hostroot import COMPUTE_MODE_FILE

LIMITS_FILE = "deviceplugin-sim-mps.json"  # sim/native/mpscontrol.c
SETTERS = "set_"


def commands(log: str) -> list[str]:
    """The commands a control.log records, in order."""
    return [line.split("Cmd:", 1)[1].strip() for line in log.splitlines() if "] Cmd:" in line]


def daemon(resource_dir: Path) -> dict[str, Any]:
    """One daemon's record: what it was told, asked, and the limits it holds."""
    try:
        told = commands((resource_dir / "log" / "control.log").read_text())
    except FileNotFoundError:
        told = []
    state: dict[str, Any] = {
        "told": sorted(c for c in told if c.startswith(SETTERS)),
        "asked": sorted({c for c in told if not c.startswith(SETTERS)}),
    }
    try:
        limits = json.loads((resource_dir / "pipe" / LIMITS_FILE).read_text())
    except FileNotFoundError:
        limits = None
    if limits is not None:
        limits.pop("pid", None)
    state["limits"] = limits
    return state


def mps_state(mps_root: Path, driver_root: Path) -> dict[str, Any]:
    """Every daemon under `mps_root` by resource name (`<domain>/<name>`), and the node's
    compute modes."""
    daemons = {
        str(log.parent.relative_to(mps_root)): daemon(log.parent)
        for log in sorted(mps_root.glob("*/*/log"))
    }
    return {"daemons": daemons, "computeModes": compute_modes(driver_root)}


def after_stop(mps_root: Path, driver_root: Path) -> dict[str, Any]:
    """What is left once everything has stopped: compute modes, and the resources whose control
    daemon still holds limits."""
    holding = sorted(
        str(pipe.parent.relative_to(mps_root))
        for pipe in mps_root.glob("*/*/pipe")
        if (pipe / LIMITS_FILE).exists()
    )
    return {"computeModes": compute_modes(driver_root), "stillServing": holding}


def compute_modes(driver_root: Path) -> dict[str, int]:
    """The devices not in DEFAULT (the simulated NVML's file; absent: none)."""
    try:
        modes: dict[str, int] = json.loads((driver_root / COMPUTE_MODE_FILE).read_text())["modes"]
    except FileNotFoundError:
        return {}
    return modes
