"""A child process watched from outside, as an operator would see it: its CPU time and RSS
come from /proc/<pid>, never from inside it. Every child is stopped on exit, killed if SIGTERM
does not end it in time, so a failing run leaves nothing behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from deviceplugin.cli import SERVE_ENV_VARS

PYTHON = sys.executable
REPO = Path(__file__).resolve().parent.parent
_TICKS = os.sysconf("SC_CLK_TCK")


def clean_env() -> dict[str, str]:
    """The environment without any variable `serve` reads, so only the given flags count."""
    return {key: value for key, value in os.environ.items() if key not in SERVE_ENV_VARS}


def cpu_seconds(pid: int) -> float:
    """utime + stime of every thread of process `pid` so far, from /proc/<pid>/stat."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def rss_bytes(pid: int) -> int:
    """VmRSS of process `pid`, from /proc/<pid>/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


class Child:
    """One child process with its output in a log file; a context manager that always stops it.
    It leads a session of its own, and stopping signals the whole group, so a wrapper (`unshare`,
    a shell) ends with what it runs. `env` defaults to `clean_env()`."""

    def __init__(
        self, argv: Sequence[str], log: Path, env: Mapping[str, str] | None = None
    ) -> None:
        self.argv = list(argv)
        self.log = log
        self.env = dict(env) if env is not None else None
        self.started = 0.0
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Child:
        """Spawn; `started` is the monotonic time just before the fork."""
        with self.log.open("ab") as out:
            self.started = time.monotonic()
            self._proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env if self.env is not None else clean_env(),
                cwd=REPO,
                start_new_session=True,
            )
        return self

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError("not started")
        return self._proc.pid

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def exit_code(self) -> int | None:
        """The exit status once the child has ended; None while it runs or before it starts."""
        return None if self._proc is None else self._proc.poll()

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.pid)

    def rss_bytes(self) -> int:
        return rss_bytes(self.pid)

    def tail(self, lines: int = 20) -> str:
        """The last lines of the child's output, to explain a failure."""
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 5.0) -> int | None:
        """SIGTERM, then SIGKILL after `timeout`; returns the exit code."""
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                return proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait()

    def __enter__(self) -> Child:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()
