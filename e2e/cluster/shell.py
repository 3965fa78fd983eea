"""How every step of `cluster` runs a host command, waits for something to be ready and fails:
a `ClusterError` whose message says which step and where its log is."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from e2e.cluster.layout import LOGS


def log(message: str) -> None:
    print(f"[cluster] {message}", file=sys.stderr, flush=True)


class ClusterError(Exception):
    """A step failed; the message says which and where its log is."""


def run(args: Sequence[str | Path], *, check: bool = True, quiet: bool = False) -> str:
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise ClusterError(
            f"{' '.join(map(str, args))}: exit {done.returncode}: {done.stderr.strip()}"
        )
    if not quiet and done.stderr.strip() and done.returncode != 0:
        log(done.stderr.strip())
    return done.stdout


def wait_for(what: str, ready: Callable[[], bool], timeout: float, log_name: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if ready():
                return
        except (OSError, ClusterError, ValueError):
            pass
        time.sleep(0.5)
    where = f"; see {LOGS / (log_name + '.log')}" if log_name else ""
    raise ClusterError(f"{what} not ready after {timeout:.0f} s{where}")
