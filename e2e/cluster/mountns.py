"""A node's own view of the host: a mount namespace in which the node's own folders are mounted
over the host paths its kubelet, its containerd and the DaemonSets use (layout.OWN_PATHS), so a
second node on this machine has its own /var/lib/kubelet, /var/run/cdi, /var/lib/deviceplugin-sim
and the rest, and sees nothing of node 1's there.

    unshare --mount --propagation private python3 mountns.py hold READY PLAN
    python3 mountns.py enter READY -- COMMAND [ARG...]

`hold` runs in the namespace `unshare` made for it and lays it out from PLAN, a JSON file
{"detach": [PATH...], "bind": [[SOURCE, TARGET]...]}: the mounts strictly beneath each `detach`
path are node 1's (its pods' volumes, its containers' root filesystems, its pods' network
namespaces), copied into the new namespace, and are detached there so that it pins none of them;
each SOURCE is then bind-mounted over its TARGET, and the whole tree made shared within the
namespace, as `cluster up` makes the host's, so the kubelet's and containerd's mounts reach the
containers. It writes its pid to READY and holds the namespace until SIGTERM. The namespace
lives while any process is in it; its mounts vanish with the last one.

`enter` joins the namespace READY names and execs COMMAND there (node 2's kubelet and
containerd, `cluster exec 2`): the pid stays the command's, for the reaper and `cluster`'s stop.

Nothing here changes the host's mounts: `hold` refuses to run in its parent's mount namespace and
makes every mount of its own private before it changes one; `enter` refuses a READY whose pid is
not the holder of that READY, or whose namespace is the caller's own. Standard library only: it
runs before any venv, as reaper.py does.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

CLONE_NEWNS = 0x00020000  # <sched.h>
REFUSED = 125  # as chroot(1) and env(1) exit when the command never ran
USAGE = "usage: mountns.py hold READY PLAN | mountns.py enter READY -- COMMAND [ARG...]"


class Refused(Exception):
    """The namespace cannot be held or entered; the message says why."""


def namespace(pid: int | str) -> str:
    """The mount namespace of a process, as its /proc link names it (`mnt:[4026531841]`)."""
    return os.readlink(f"/proc/{pid}/ns/mnt")


def mount_points(mountinfo: str) -> list[str]:
    """The mount points a /proc/PID/mountinfo lists (its fifth field, unescaped)."""
    return [unescape(line.split()[4]) for line in mountinfo.splitlines() if line.strip()]


def unescape(field: str) -> str:
    """mountinfo writes a space, tab, newline or backslash of a path as a backslash and 3 octal
    digits."""
    return re.sub(r"\\([0-7]{3})", lambda found: chr(int(found.group(1), 8)), field)


def beneath(points: Iterable[str], roots: Iterable[str]) -> list[str]:
    """The mount points strictly beneath any of `roots` (symbolic links resolved, as the kernel
    lists them), deepest first so that each is detached before what it sits on."""
    prefixes = tuple(os.path.realpath(root).rstrip("/") + "/" for root in roots)
    return sorted(
        {point for point in points if point.startswith(prefixes)},
        key=lambda point: (-point.count("/"), point),
    )


def mount(*args: str) -> None:
    done = subprocess.run(["mount", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise Refused(f"mount {' '.join(args)}: {done.stderr.strip()}")


def hold(ready: Path, plan_file: Path) -> None:
    """Lay out this process's own mount namespace from the plan, then hold it until SIGTERM."""
    if namespace("self") == namespace(os.getppid()):
        raise Refused("not in a mount namespace of its own: start it with `unshare --mount`")
    plan = json.loads(plan_file.read_text())
    stopping = False

    def stop(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    mount("--make-rprivate", "/")  # from here on no mount or unmount reaches the host
    for point in beneath(mount_points(Path("/proc/self/mountinfo").read_text()), plan["detach"]):
        done = subprocess.run(["umount", "--lazy", point], capture_output=True, text=True)
        if done.returncode != 0:  # still hidden under its bind mount, only pinned longer
            print(f"mountns: could not detach {point}: {done.stderr.strip()}", flush=True)
    for source, target in plan["bind"]:
        Path(source).mkdir(parents=True, exist_ok=True)
        Path(target).mkdir(parents=True, exist_ok=True)
        mount("--bind", source, target)
    mount("--make-rshared", "/")
    scratch = ready.with_name(f".{ready.name}.new")
    scratch.write_text(f"{os.getpid()}\n")
    os.replace(scratch, ready)
    print(f"mountns: pid {os.getpid()} holds {namespace('self')}", flush=True)
    while not stopping:
        signal.pause()
    with contextlib.suppress(OSError, ValueError):
        if int(ready.read_text()) == os.getpid():
            ready.unlink()
    print("mountns: exiting; the namespace ends with the last process in it", flush=True)


def enter(ready: Path, command: Sequence[str]) -> int:
    """Join the namespace of the holder that READY names and exec `command` there; the exit
    status of a shell's (127, 126) when it cannot be run."""
    try:
        pid = int(ready.read_text())
    except (OSError, ValueError):
        raise Refused(f"{ready} names no holder: is the node up?") from None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        cmdline = []
    own = os.fsencode(str(ready))
    if own not in cmdline or cmdline[cmdline.index(own) - 1] != b"hold":
        raise Refused(f"pid {pid} in {ready} is not the holder of that namespace (a stale file?)")
    fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY)
    try:
        if os.readlink(f"/proc/self/fd/{fd}") == namespace("self"):
            raise Refused(f"pid {pid} holds this process's own mount namespace, not one of its own")
        cwd = os.getcwd()
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.setns(fd, CLONE_NEWNS) != 0:
            raise Refused(f"cannot join pid {pid}'s namespace: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)
    try:
        os.chdir(cwd)  # the same folder, as the namespace shows it
    except OSError:
        os.chdir("/")
    try:
        os.execvp(command[0], list(command))
    except OSError as exc:
        print(f"mountns: {command[0]}: {exc.strerror}", file=sys.stderr)
        return 127 if isinstance(exc, FileNotFoundError) else 126


def main(argv: Sequence[str]) -> int:
    try:
        if len(argv) == 3 and argv[0] == "hold":
            hold(Path(argv[1]), Path(argv[2]))
            return 0
        if len(argv) >= 4 and argv[0] == "enter" and argv[2] == "--":
            return enter(Path(argv[1]), argv[3:])
    except (Refused, OSError) as exc:
        print(f"mountns: {exc}", file=sys.stderr)
        return REFUSED
    print(USAGE, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
