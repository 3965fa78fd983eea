"""One prepare or unprepare at a time on the node, across processes.

A rolling update briefly runs two drivers on a node, and both read and rewrite the one
checkpoint and the claims' CDI specs. Each change takes an exclusive `flock` on a file beside
the checkpoint first; the kernel releases it when the holder closes it or dies, so a killed
driver never leaves the node locked. Waiting polls without blocking the event loop, and gives
up after a limit (below the kubelet's call timeout) with an error naming the file.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from collections.abc import AsyncIterator
from pathlib import Path

from deviceplugin.model.errors import DevicePluginError

LOCK_TIMEOUT_SECONDS = 20.0
_POLL_SECONDS = 0.01


class LockTimeout(DevicePluginError):
    """Another process held the lock for longer than the limit."""


class NodeLock:
    """An exclusive lock on `path` (created when missing), held by `async with lock.held()`."""

    def __init__(self, path: Path, timeout: float = LOCK_TIMEOUT_SECONDS) -> None:
        self.path = path
        self.timeout = timeout

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        """Raises LockTimeout, or OSError when the file cannot be opened."""
        fd = await asyncio.to_thread(self._open)
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.timeout
            while not _try_lock(fd):
                if loop.time() >= deadline:
                    raise LockTimeout(
                        f"another process has held {self.path} for more than {self.timeout:g} s"
                    )
                await asyncio.sleep(_POLL_SECONDS)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _open(self) -> int:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True
