"""The cluster's own init: a child subreaper that starts the components processes.py asks it to
start and reaps every process that ends beneath it.

A process whose parent exits is re-parented to its nearest living ancestor that is a child
subreaper, and to PID 1 only when there is none. containerd starts each pod's shim that way (the
shim's starter exits at once), and node.py's components outlive the command that started them.
PID 1 on these machines is not an init that can be relied on to reap them, so exited shims and
stopped components stayed `<defunct>`. Every component is therefore this process's child, and
every orphan beneath them becomes its child too, and is reaped here within a second.

    python3 reaper.py SOCKET    # serves until SIGTERM, then reaps what is left and exits

A request is one JSON line on SOCKET, {"args": [...], "log": PATH, "env": {...}}: the component
is started in a session of its own, stdin from /dev/null, stdout and stderr appended to PATH. The
answer is {"pid": N} or {"error": "..."}. Standard library only: it runs before any venv.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import selectors
import signal
import socket
import sys
import time
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
DRAIN_SECONDS = 10.0


def become_subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def reap() -> int:
    """Collects every child that has exited; returns how many are still running."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return 0
        if pid == 0:
            return len(children())


def children() -> list[int]:
    found = []
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        with contextlib.suppress(OSError):
            found += [int(p) for p in (task / "children").read_text().split()]
    return found


def start(request: dict[str, object]) -> int:
    args = [str(a) for a in request["args"]]  # type: ignore[attr-defined]
    env = {str(k): str(v) for k, v in request["env"].items()}  # type: ignore[attr-defined]
    log = str(request["log"])
    return os.posix_spawnp(
        args[0],
        args,
        env,
        file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644),
            (os.POSIX_SPAWN_DUP2, 1, 2),
        ],
        setsid=True,
    )


def answer(conn: socket.socket) -> None:
    with conn:
        conn.settimeout(5)
        try:
            request = json.loads(conn.makefile("rb").readline())
            reply: dict[str, object] = {"pid": start(request)}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps(reply).encode() + b"\n")


def serve(path: Path) -> None:
    become_subreaper()
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    stopping = False

    def stop(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)  # only to wake the loop

    path.unlink(missing_ok=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(16)
    events = selectors.DefaultSelector()
    events.register(server, selectors.EVENT_READ)
    events.register(wake_read, selectors.EVENT_READ)
    print(f"reaper: pid {os.getpid()}, serving {path}", flush=True)
    while not stopping:
        for key, _ in events.select(timeout=1.0):
            if key.fileobj is server:
                answer(server.accept()[0])
            else:
                os.read(wake_read, 512)
        reap()
    server.close()
    path.unlink(missing_ok=True)
    # Whatever is still running is re-parented to PID 1 when this process exits: give it a
    # moment to end first (node.py stops this process only after stopping everything else).
    deadline = time.monotonic() + DRAIN_SECONDS
    while reap() and time.monotonic() < deadline:
        time.sleep(0.2)
    print(f"reaper: exiting, {len(children())} children left", flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: reaper.py SOCKET")
    serve(Path(sys.argv[1]))
