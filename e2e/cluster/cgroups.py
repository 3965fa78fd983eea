"""A node's own cgroup root. Both nodes' kubelets share the host's cgroups, and a kubelet takes
every pod cgroup under its root's `kubepods` that it does not know for an orphan and kills it; so
a node after the first puts its pods under a root of its own (`/deviceplugin-e2e-2`), which must
exist before its kubelet starts: made here in every hierarchy, as kind makes `/kubelet`."""

from __future__ import annotations

import contextlib
from pathlib import Path

from e2e.cluster.mountns import unescape

MOUNTINFO = Path("/proc/self/mountinfo")
# A new cgroup v1 cpuset has no CPUs and no memory nodes: nothing could run in it.
CPUSET_FILES = ("cpuset.cpus", "cpuset.mems")


def hierarchies(mountinfo: str) -> list[Path]:
    """The mount point of every cgroup hierarchy (v1 and v2) a mountinfo lists."""
    found = []
    for line in mountinfo.splitlines():
        fields = line.split()
        fstype = fields[fields.index("-") + 1]
        if fstype in ("cgroup", "cgroup2"):
            found.append(Path(unescape(fields[4])))
    return found


def make_root(root: str, mounted: list[Path]) -> None:
    """`root` (a cgroup path, `/name`) in every hierarchy, a cpuset's CPUs and memory nodes
    those of its parent."""
    for hierarchy in mounted:
        path = hierarchy / root.lstrip("/")
        path.mkdir(exist_ok=True)
        for name in CPUSET_FILES:
            parent, own = path.parent / name, path / name
            if parent.exists() and not (own.exists() and own.read_text().strip()):
                own.write_text(parent.read_text())


def node_roots(root: str, mounted: list[Path]) -> list[Path]:
    """Where `root` is, in each hierarchy that has it."""
    paths = [hierarchy / root.lstrip("/") for hierarchy in mounted]
    return [path for path in paths if path.is_dir()]


def remove_root(path: Path) -> None:
    """The cgroup and every cgroup beneath it, deepest first (each must be empty of processes)."""
    for cgroup in sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        with contextlib.suppress(OSError):
            cgroup.rmdir()
    with contextlib.suppress(OSError):
        path.rmdir()
