"""The real node's reaper (e2e/cluster/reaper.py): components start as its children, orphans
they leave are re-parented to it and reaped, so nothing stays `<defunct>` on a machine whose
PID 1 does not reap."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REAPER = Path(__file__).resolve().parent.parent / "e2e" / "cluster" / "reaper.py"


def wait_until(condition: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def stat(pid: int) -> tuple[str, int] | None:
    """(state, ppid) of a process, or None once it is gone (reaped)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    state, ppid = text[text.rindex(")") + 2 :].split()[:2]
    return state, int(ppid)


@pytest.fixture
def reaper(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    sock = tmp_path / "reaper.sock"
    process = subprocess.Popen([sys.executable, str(REAPER), str(sock)])
    wait_until(sock.is_socket)
    yield process, sock
    process.terminate()
    process.wait(timeout=20)


def ask(sock: Path, request: dict[str, object]) -> dict[str, object]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(str(sock))
        conn.sendall(json.dumps(request).encode() + b"\n")
        reply: dict[str, object] = json.loads(conn.makefile("rb").readline())
        return reply


def test_an_orphan_is_reparented_to_the_reaper_and_reaped(
    reaper: tuple[subprocess.Popen[bytes], Path], tmp_path: Path
) -> None:
    process, sock = reaper
    log = tmp_path / "component.log"
    # The component leaves a background child and exits at once: that child is an orphan, as a
    # containerd shim is once its starter exits.
    reply = ask(
        sock,
        {"args": ["sh", "-c", "sleep 1 & echo $!; exit 0"], "log": str(log), "env": {}},
    )
    component = int(str(reply["pid"]))
    wait_until(lambda: log.read_text().strip().isdigit())
    orphan = int(log.read_text())
    wait_until(lambda: stat(component) is None)  # the component itself was reaped
    alive = stat(orphan)
    assert alive is not None and alive[1] == process.pid, alive
    wait_until(lambda: stat(orphan) is None)  # exited and reaped, not left <defunct>


def test_a_component_gets_its_own_session_log_and_environment(
    reaper: tuple[subprocess.Popen[bytes], Path], tmp_path: Path
) -> None:
    _, sock = reaper
    log = tmp_path / "component.log"
    log.write_text("earlier run\n")
    reply = ask(
        sock,
        {
            "args": ["sh", "-c", 'echo "$GREETING"; echo to-stderr >&2; ps -o sid= -p $$'],
            "log": str(log),
            "env": {"GREETING": "hello", "PATH": os.environ["PATH"]},
        },
    )
    pid = int(str(reply["pid"]))
    wait_until(lambda: stat(pid) is None)
    lines = log.read_text().split("\n")
    assert lines[:3] == ["earlier run", "hello", "to-stderr"]
    assert int(lines[3]) == pid, "not the leader of a session of its own"


def test_a_component_that_cannot_start_is_an_error_not_a_crash(
    reaper: tuple[subprocess.Popen[bytes], Path], tmp_path: Path
) -> None:
    process, sock = reaper
    reply = ask(sock, {"args": ["/nonexistent/kubelet"], "log": str(tmp_path / "x.log"), "env": {}})
    assert "FileNotFoundError" in str(reply["error"])
    assert ask(sock, {"args": []})["error"]
    assert process.poll() is None


def test_sigterm_ends_it_and_removes_its_socket(
    reaper: tuple[subprocess.Popen[bytes], Path],
) -> None:
    process, sock = reaper
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=20) == 0
    assert not sock.exists()
