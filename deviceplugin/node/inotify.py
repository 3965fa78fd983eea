"""Linux inotify through libc: what changes in watched directories, read by the event loop.

One inotify descriptor serves every watched directory of a process, and the asyncio loop reads
it when the kernel says it is readable: no thread per directory, none at all. A handler gets
each `DirectoryEvent` on the loop. `open_inotify` and `add_watch` are the bare calls, for a
waiter that blocks on its own descriptor (the simulator's events file).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import os
import struct
import threading
from collections.abc import Callable
from typing import Any

from deviceplugin.model.record import record

IN_MODIFY = 0x2
IN_ATTRIB = 0x4
IN_CLOSE_WRITE = 0x8
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x1000000
# What a directory watch asks for: every change to what is on disk, none of the reads.
DIRECTORY_CHANGES = (
    IN_MODIFY
    | IN_ATTRIB
    | IN_CLOSE_WRITE
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_CREATE
    | IN_DELETE
    | IN_DELETE_SELF
    | IN_MOVE_SELF
    | IN_ONLYDIR
)
_KINDS = (  # the first that applies names an event
    (IN_CREATE, "created"),
    (IN_DELETE | IN_DELETE_SELF, "deleted"),
    (IN_MOVED_FROM | IN_MOVED_TO | IN_MOVE_SELF, "moved"),
    (IN_CLOSE_WRITE, "closed"),
    (IN_MODIFY | IN_ATTRIB, "modified"),
    (IN_Q_OVERFLOW, "lost"),
)
_HEADER = struct.Struct("iIII")  # wd, mask, cookie, length of the name


@functools.cache
def _libc() -> Any:
    import ctypes  # loaded with the first watch: start-up registers with the kubelet first

    libc = ctypes.CDLL(None, use_errno=True)
    if not hasattr(libc, "inotify_init1"):
        raise OSError(errno.ENOSYS, "no inotify on this system")
    return libc


def _failed() -> OSError:
    import ctypes

    code = ctypes.get_errno()
    return OSError(code, os.strerror(code))


def open_inotify() -> int:
    """A new non-blocking inotify descriptor; OSError when there is none (no inotify, or no
    instance left)."""
    fd = _libc().inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    if fd < 0:
        raise _failed()
    return int(fd)


def add_watch(fd: int, directory: str | os.PathLike[str], mask: int) -> int:
    """Watch `directory` on `fd` for `mask`; its watch descriptor. OSError when it cannot."""
    wd = _libc().inotify_add_watch(fd, os.fsencode(directory), mask)
    if wd < 0:
        raise _failed()
    return int(wd)


@record(frozen=True)
class DirectoryEvent:
    """A change in a watched directory: `kind` is created, deleted, moved, closed (written and
    closed) or modified; `name` is the entry's name, "" for the directory itself. Kind "lost":
    the kernel's queue overflowed and events were dropped, anything may have changed."""

    kind: str
    directory: str
    name: str


Handler = Callable[[DirectoryEvent], None]


class DirectoryWatch:
    """One handler's watch of one directory, to `DirectoryWatches.remove`."""

    def __init__(self, wd: int, directory: str, handler: Handler) -> None:
        self.wd = wd
        self.directory = directory
        self.handler = handler


class DirectoryWatches:
    """Every directory watch of one event loop, on one inotify descriptor that the loop reads.
    `add` and `remove` may be called from any thread; handlers run on the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._closed = False
        self._started = False
        self._reading = False
        self._watches: dict[int, list[DirectoryWatch]] = {}

    def add(self, directory: str, handler: Handler) -> DirectoryWatch:
        """Call `handler` with each change in `directory`. OSError when it cannot be watched."""
        with self._lock:
            if self._closed:  # a re-arm finishing during shutdown: nothing reads events now
                return DirectoryWatch(-1, directory, handler)
            if self._fd is None:
                self._fd = open_inotify()
                if self._started:  # a first watch after start: the loop reads it from now
                    self._loop.call_soon_threadsafe(self.start)
            watch = DirectoryWatch(
                add_watch(self._fd, directory, DIRECTORY_CHANGES), directory, handler
            )
            self._watches.setdefault(watch.wd, []).append(watch)
            return watch

    def remove(self, watch: DirectoryWatch) -> None:
        """Stop calling `watch`'s handler; the directory is unwatched with its last handler."""
        with self._lock:
            same = self._watches.get(watch.wd, [])
            if watch not in same:
                return
            same.remove(watch)
            if not same:
                del self._watches[watch.wd]
                if self._fd is not None:
                    with contextlib.suppress(OSError):  # gone with its directory already
                        if _libc().inotify_rm_watch(self._fd, watch.wd) < 0:
                            raise _failed()

    def start(self) -> None:
        """Start handing events to the handlers. Call on the loop."""
        self._started = True
        if self._fd is not None and not self._reading:
            self._loop.add_reader(self._fd, self._read)
            self._reading = True

    def close(self) -> None:
        """Stop watching; callable from any thread (the descriptor is closed on the loop)."""
        with self._lock:
            self._closed = True
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            self._close()
            return
        try:
            self._loop.call_soon_threadsafe(self._close)
        except RuntimeError:  # the loop has closed: nothing reads the descriptor any more
            self._reading = False
            self._close()

    def _close(self) -> None:
        with self._lock:
            fd, self._fd = self._fd, None
            self._watches.clear()
        if fd is None:
            return
        if self._reading:
            self._loop.remove_reader(fd)
            self._reading = False
        os.close(fd)

    def _read(self) -> None:
        """Hand every queued event to its handlers (the loop calls this when fd is readable)."""
        while self._fd is not None:
            try:
                data = os.read(self._fd, 65536)
            except OSError:  # BlockingIOError: all read
                return
            for watch, event in self._decode(data):
                watch.handler(event)

    def _decode(self, data: bytes) -> list[tuple[DirectoryWatch, DirectoryEvent]]:
        """The kernel's event records, each paired with the watches it is for."""
        found = []
        offset = 0
        while offset + _HEADER.size <= len(data):
            wd, mask, _cookie, length = _HEADER.unpack_from(data, offset)
            start = offset + _HEADER.size
            name = os.fsdecode(data[start : start + length].rstrip(b"\0"))
            offset = start + length
            with self._lock:
                if mask & IN_Q_OVERFLOW:
                    watches = [watch for same in self._watches.values() for watch in same]
                else:
                    watches = list(self._watches.get(wd, ()))
                if mask & IN_IGNORED:  # the kernel dropped the watch: its directory is gone
                    self._watches.pop(wd, None)
            kind = next((kind for bits, kind in _KINDS if mask & bits), None)
            if kind is not None:
                found += [(watch, DirectoryEvent(kind, watch.directory, name)) for watch in watches]
        return found
