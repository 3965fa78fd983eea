"""File-system watchers that turn outside changes into supervisor triggers.

Two kinds of watch, each on DIRECTORIES:
- the config file (`ConfigWatch`): a ConfigMap volume is updated by renaming `..data_tmp` over
  the `..data` symlink, which a watch on the file itself never sees, so the file's directory is
  watched; so is the directory of every symlink the path leads through and of the file it ends
  at (a config linked to another directory). A watched directory deleted and made again is
  watched anew, and one that is missing is waited for from its nearest existing parent. Any
  relevant event schedules a reload; the supervisor compares content, so spurious events cost
  one read. Every CONFIG_CHECK_SECONDS a stat of the file (through its links) catches what the
  events missed, so the watch never stops silently.
- the kubelet directory: `kubelet.sock` created anew, or one of our sockets deleted (the kubelet
  deletes plugin sockets when it starts), schedules a kubelet-restart check.
Every watch of a plugin shares one inotify descriptor that the event loop reads
(`node.inotify`): no thread per watched directory, events handled on the loop, and bursts of
events collapse into one trigger.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections.abc import Callable, Coroutine, Set
from pathlib import Path
from typing import Any

from deviceplugin.model.log import log_event
from deviceplugin.node.inotify import DirectoryEvent, DirectoryWatch, DirectoryWatches
from deviceplugin.runtime.background import spawn

logger = logging.getLogger(__name__)

Trigger = Callable[[], Coroutine[Any, Any, Any]]
CONFIG_CHECK_SECONDS = 5.0  # how often the config file is stat'ed, whatever the events say
_MAX_LINKS = 40  # symlinks followed from the config path, as the kernel's limit


class Debounced:
    """Runs `action` on the loop once per burst of calls made within `delay` seconds."""

    def __init__(self, loop: asyncio.AbstractEventLoop, action: Trigger, delay: float) -> None:
        self._loop = loop
        self._action = action
        self._delay = delay
        self._pending: asyncio.TimerHandle | None = None

    def fire(self) -> None:
        """Call on the loop."""
        if self._pending is not None:
            self._pending.cancel()
        self._pending = self._loop.call_later(self._delay, self._run)

    def _run(self) -> None:
        self._pending = None
        spawn(self._action(), "file watch")


def _when(
    wanted: Callable[[DirectoryEvent], bool], fire: Callable[[], None]
) -> Callable[[DirectoryEvent], None]:
    """A watch handler that fires on the events `wanted` says matter."""

    def handle(event: DirectoryEvent) -> None:
        if wanted(event):
            fire()

    return handle


def _identity(directory: str) -> tuple[int, int] | None:
    """Which directory is at a path now (a new one if it was deleted and made again)."""
    try:
        info = os.stat(directory)
    except OSError:
        return None
    return (info.st_dev, info.st_ino)


def _fingerprint(path: Path) -> tuple[object, ...]:
    """What changes when the config file's content may have: where its links lead, its inode,
    size and times; a file that cannot be stat'ed reads as why not."""
    try:
        info = os.stat(path)
    except OSError as exc:
        return ("missing", exc.errno)
    return (
        os.path.realpath(path),
        info.st_dev,
        info.st_ino,
        info.st_size,
        info.st_mtime_ns,
        info.st_ctime_ns,
    )


def config_targets(path: Path) -> dict[str, frozenset[str]]:
    """Directory -> the names in it whose changes matter: the path as given (and a ConfigMap's
    `..data` beside it), each symlink it leads through and the file it ends at. A directory
    that does not exist is stood for by its nearest existing parent, watching the name that
    leads towards it, so its re-creation is seen."""
    found: dict[str, set[str]] = {}

    def add(place: str, name: str) -> None:
        directory = place
        while not os.path.isdir(directory) and os.path.dirname(directory) != directory:
            directory, name = os.path.dirname(directory), os.path.basename(directory)
        found.setdefault(directory, set()).add(name)

    given = os.path.abspath(path)
    add(os.path.dirname(given), os.path.basename(given))
    add(os.path.dirname(given), "..data")
    hop = given
    for _ in range(_MAX_LINKS):
        try:
            link = os.readlink(hop)
        except OSError:
            break
        hop = os.path.normpath(os.path.join(os.path.dirname(hop), link))
        add(os.path.dirname(hop), os.path.basename(hop))
    real = os.path.realpath(given)
    add(os.path.dirname(real), os.path.basename(real))
    return {directory: frozenset(names) for directory, names in found.items()}


class ConfigWatch:
    """Follows one config file through ConfigMap swaps, symlinks into other directories and its
    directory being deleted and made again; calls `on_change` on the loop when it may have
    changed."""

    def __init__(
        self,
        watches: DirectoryWatches,
        loop: asyncio.AbstractEventLoop,
        path: Path | Callable[[], Path],
        on_change: Trigger,
        delay: float,
    ) -> None:
        self._directories = watches
        self._loop = loop
        self._path = path if callable(path) else lambda: path
        self._on_change = on_change
        self._debounced = Debounced(loop, self._changed, delay)
        self._lock = threading.Lock()  # re-arming runs on worker threads, one at a time
        self._watches: dict[str, tuple[DirectoryWatch, tuple[int, int]]] = {}
        self._relevant: dict[str, frozenset[str]] = {}  # replaced whole; read by watch handlers
        self._fingerprint: tuple[object, ...] = ()
        self._lost = False
        self._poller: asyncio.Task[None] | None = None

    def start(self, check_every: float = CONFIG_CHECK_SECONDS) -> None:
        """Watch now, and stat the file every `check_every` seconds. Call on the loop."""
        self._rearm()
        self._poller = self._loop.create_task(self._poll(check_every))

    def stop(self) -> None:
        """Stop the periodic check; callable from any thread."""
        if self._poller is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed already
                self._loop.call_soon_threadsafe(self._poller.cancel)

    async def _poll(self, every: float) -> None:
        """Re-arm the watches and stat the file every `every` seconds; reload when the stat
        differs from the last look."""
        while True:
            await asyncio.sleep(every)
            try:
                if await asyncio.to_thread(self._rearm):
                    await self._on_change()
            except Exception:
                logger.exception("watch.config.check_failed")

    async def _changed(self) -> None:
        """An event said the file may have changed: follow its links anew, then reload."""
        await asyncio.to_thread(self._rearm)
        await self._on_change()

    def _rearm(self) -> bool:
        """Watch the directories the path leads through now; True when the file's stat changed
        since the last look."""
        with self._lock:
            path = self._path()
            wanted = config_targets(path)
            self._relevant = wanted
            for directory in list(self._watches):
                watch, identity = self._watches[directory]
                if directory not in wanted or _identity(directory) != identity:
                    del self._watches[directory]
                    self._directories.remove(watch)
            for directory in wanted:
                if directory not in self._watches:
                    self._schedule(directory)
            self._report_lost(path, wanted)
            fingerprint = _fingerprint(path)
            changed, self._fingerprint = fingerprint != self._fingerprint, fingerprint
            return changed

    def _schedule(self, directory: str) -> None:
        identity = _identity(directory)
        if identity is None:  # gone again already; the next look retries
            return

        def wanted(event: DirectoryEvent) -> bool:
            if event.kind == "lost" or not event.name:  # events dropped, or the directory went
                return True
            return event.name in self._relevant.get(directory, frozenset())

        try:
            watch = self._directories.add(directory, _when(wanted, self._debounced.fire))
        except OSError as exc:
            log_event(
                logger,
                "watch.config.failed",
                logging.WARNING,
                directory=directory,
                error=exc.strerror or str(exc),
                fallback=f"the file is checked every {CONFIG_CHECK_SECONDS:g} s",
            )
            return
        self._watches[directory] = (watch, identity)

    def _report_lost(self, path: Path, wanted: dict[str, frozenset[str]]) -> None:
        directory = os.path.dirname(os.path.abspath(path))
        lost = directory not in wanted
        if lost and not self._lost:
            log_event(
                logger,
                "watch.config.lost",
                logging.WARNING,
                directory=directory,
                watching=sorted(wanted),
                hint="the config directory is gone; it is watched for again, the last good "
                "config stays in force",
            )
        elif self._lost and not lost:
            log_event(logger, "watch.config.restored", directory=directory)
        self._lost = lost


class Watchers:
    """The config-file and kubelet-directory watches of one running plugin, on one inotify
    descriptor read by the loop given to the first watch."""

    def __init__(self) -> None:
        self._directories: DirectoryWatches | None = None
        self._config: ConfigWatch | None = None

    def _on(self, loop: asyncio.AbstractEventLoop) -> DirectoryWatches:
        if self._directories is None:
            self._directories = DirectoryWatches(loop)
        return self._directories

    def watch_config(
        self,
        loop: asyncio.AbstractEventLoop,
        config_file: Path | Callable[[], Path],
        on_change: Trigger,
        delay: float = 0.05,
        check_every: float = CONFIG_CHECK_SECONDS,
    ) -> None:
        """Reload when the config file may have changed (see `ConfigWatch`); `config_file` may
        be a function, for a file chosen anew as the node's label changes. Call on the loop."""
        self._config = ConfigWatch(self._on(loop), loop, config_file, on_change, delay)
        self._config.start(check_every)
        log_event(
            logger,
            "watch.config",
            directory=str((config_file() if callable(config_file) else config_file).parent),
            check_every_seconds=check_every,
        )

    def watch_kubelet(
        self,
        loop: asyncio.AbstractEventLoop,
        kubelet_socket: Path,
        our_sockets: Callable[[], Set[str]],
        on_change: Trigger,
        delay: float = 0.02,
    ) -> None:
        """Check the kubelet when `kubelet_socket` appears or goes, or one of our sockets (in
        its directory) goes."""
        kubelet_dir = kubelet_socket.parent
        debounced = Debounced(loop, on_change, delay)

        def wanted(event: DirectoryEvent) -> bool:
            if event.kind == "lost":
                return True
            if event.name == kubelet_socket.name and event.kind in ("created", "moved", "deleted"):
                return True
            return event.kind in ("deleted", "moved") and event.name in our_sockets()

        kubelet_dir.mkdir(parents=True, exist_ok=True)
        self._on(loop).add(str(kubelet_dir), _when(wanted, debounced.fire))
        log_event(logger, "watch.kubelet", directory=str(kubelet_dir))

    def start(self) -> None:
        """Start handling events. Call on the loop."""
        if self._directories is not None:
            self._directories.start()

    def stop(self) -> None:
        """Stop every watch; callable from any thread."""
        if self._config is not None:
            self._config.stop()
        if self._directories is not None:
            self._directories.close()
