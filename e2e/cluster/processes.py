"""The cluster's processes: each component started as a child of the reaper (reaper.py), its PID
in `run/pids/` and its output in `run/logs/`, stopped by name; and, from /proc, what runs from
the cluster's binaries or in a node's mount namespace, what it left `<defunct>`, and how to end
all of it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from e2e.cluster.cgroups import MOUNTINFO, hierarchies, node_roots, remove_root
from e2e.cluster.layout import CACHE, HERE, KUBELET_ROOT, LOGS, NODES, PIDS, RUN, Node
from e2e.cluster.shell import ClusterError, log, wait_for

REAPER = "reaper"
REAPER_SOCKET = RUN / "reaper.sock"
# Binaries of the cluster that are not components: started by containerd, the kubelet or by hand.
CLUSTER_HELPERS = (
    "containerd-shim-runc-v2",
    "runc",
    "ctr",
    "crictl",
    "pause",
    "bridge",
    "loopback",
    "host-local",
    "portmap",
)
STOP_ORDER = (
    "kubelet",
    "containerd",
    "kube-scheduler",
    "kube-controller-manager",
    "kube-apiserver",
    "etcd",
)


@dataclass(frozen=True)
class Component:
    name: str
    args: tuple[str, ...]


def pid_of(name: str) -> int | None:
    try:
        pid = int((PIDS / f"{name}.pid").read_text())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid


def start(component: Component) -> None:
    if pid_of(component.name):
        log(f"{component.name}: already running")
        return
    LOGS.mkdir(parents=True, exist_ok=True)
    PIDS.mkdir(parents=True, exist_ok=True)
    (RUN / "cmdline").mkdir(exist_ok=True)
    (RUN / "cmdline" / component.name).write_text("\0".join(component.args))
    log_path = LOGS / f"{component.name}.log"
    pid = ask_reaper({"args": component.args, "log": str(log_path), "env": dict(os.environ)})
    (PIDS / f"{component.name}.pid").write_text(str(pid))
    log(f"{component.name}: started (pid {pid}, log {log_path})")


def ask_reaper(request: dict[str, object]) -> int:
    """Starts a component as the reaper's child (reaper.py), so that it and every orphan it
    leaves (containerd's shims) are reaped when they end; starts the reaper first if need be."""
    if not pid_of(REAPER):
        PIDS.mkdir(parents=True, exist_ok=True)
        with open(LOGS / f"{REAPER}.log", "ab") as out:
            process = subprocess.Popen(
                [sys.executable, str(HERE / "reaper.py"), str(REAPER_SOCKET)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        (PIDS / f"{REAPER}.pid").write_text(str(process.pid))
        wait_for("reaper", REAPER_SOCKET.is_socket, 10, REAPER)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(10)
        conn.connect(str(REAPER_SOCKET))
        conn.sendall(json.dumps(request).encode() + b"\n")
        reply = json.loads(conn.makefile("rb").readline() or b"{}")
    if "pid" not in reply:
        raise ClusterError(f"the reaper could not start {request['args']}: {reply.get('error')}")
    return int(reply["pid"])


def stop(name: str, timeout: float = 20) -> None:
    pid = pid_of(name)
    if pid is None:
        (PIDS / f"{name}.pid").unlink(missing_ok=True)
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and pid_of(name):
        time.sleep(0.2)
    if pid_of(name):
        os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
    (PIDS / f"{name}.pid").unlink(missing_ok=True)
    log(f"{name}: stopped")


def kill_leftovers() -> None:
    """Every process run from the cluster's binaries (components, shims), every process left in
    a node's mount namespace (its holder, a `cluster exec 2`), so that the namespace and its
    mounts end, and every process in the pods' cgroups, then those cgroups themselves (node 1's
    `kubepods`, the other nodes' own roots)."""
    for pid in binary_pids() | {pid for node in NODES for pid in in_namespace_of(node)}:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    mounted = hierarchies(MOUNTINFO.read_text())
    pod_cgroups = sorted(Path("/sys/fs/cgroup").glob("*/kubepods")) + [
        root for node in NODES if node.cgroup_root for root in node_roots(node.cgroup_root, mounted)
    ]
    for root in pod_cgroups:
        for procs in root.rglob("cgroup.procs"):
            for member in procs.read_text().split():
                with contextlib.suppress(OSError):
                    os.kill(int(member), signal.SIGKILL)
    time.sleep(0.5)
    for root in pod_cgroups:
        remove_root(root)


def in_namespace_of(node: Node) -> set[int]:
    """Every process in the node's mount namespace, known by what it shows at the kubelet's
    root: the node's own folder (none for node 1, which has the host's)."""
    if node.own_tree is None:
        return set()
    return namespace_members(node.host_path(KUBELET_ROOT), KUBELET_ROOT)


def namespace_members(source: Path, target: Path) -> set[int]:
    """Every process whose mount namespace (not this process's) shows the folder `source` at
    `target`: the same file (device and inode) seen through one member's root, for each
    namespace, and the whole namespace counted."""
    try:
        wanted = os.stat(source)
    except OSError:
        return set()
    by_namespace: dict[str, set[int]] = {}
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError):
            by_namespace.setdefault(os.readlink(proc / "ns" / "mnt"), set()).add(int(proc.name))
    by_namespace.pop(os.readlink("/proc/self/ns/mnt"), None)
    found: set[int] = set()
    for members in by_namespace.values():
        for pid in members:  # the first that can still be read speaks for the namespace
            try:
                seen = os.stat(f"/proc/{pid}/root{target}")
            except OSError:
                continue
            if (seen.st_dev, seen.st_ino) == (wanted.st_dev, wanted.st_ino):
                found |= members
            break
    return found


def processes() -> dict[int, tuple[str, str, int]]:
    """pid -> (comm, state, ppid) for every process, from /proc/PID/stat."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError):
            stat = (proc / "stat").read_text()
            comm = stat[stat.index("(") + 1 : stat.rindex(")")]
            state, ppid = stat[stat.rindex(")") + 2 :].split()[:2]
            found[int(proc.name)] = (comm, state, int(ppid))
    return found


def binary_pids() -> set[int]:
    """Every live process run from the cluster's binaries (components, shims)."""
    pids = set()
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError):
            if os.readlink(proc / "exe").startswith(str(CACHE) + "/"):
                pids.add(int(proc.name))
    return pids


def defunct() -> list[str]:
    """`<defunct>` processes of the cluster: named after one of its binaries (the kernel keeps
    15 characters of a name), or children of the reaper or of a cluster process."""
    names = {name[:15] for name in (*STOP_ORDER, *CLUSTER_HELPERS)}
    parents = binary_pids() | {pid for pid in [pid_of(REAPER)] if pid}
    return [
        f"pid {pid} [{comm}] <defunct>, parent {ppid}"
        for pid, (comm, state, ppid) in sorted(processes().items())
        if state == "Z" and (comm in names or ppid in parents)
    ]
