"""File-system watchers that turn outside changes into supervisor triggers.

Two watchdog observers, each on a DIRECTORY:
- the config file's directory: a ConfigMap volume is updated by renaming `..data_tmp` over the
  `..data` symlink, which a watch on the file itself never sees. Any event there schedules a
  reload; the supervisor compares content, so spurious events cost one read.
- the kubelet directory: `kubelet.sock` created anew, or one of our sockets deleted (the kubelet
  deletes plugin sockets when it starts), schedules a kubelet-restart check.
Observer threads never touch state: they post to the event loop with call_soon_threadsafe, and
bursts of events collapse into one trigger.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Coroutine, Set
from pathlib import Path
from typing import Any

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

from deviceplugin.background import spawn
from deviceplugin.kubelet.registration import KUBELET_SOCKET
from deviceplugin.model.log import log_event

logger = logging.getLogger(__name__)

Trigger = Callable[[], Coroutine[Any, Any, Any]]
# Events that change what is on disk; opening or reading a file (as every reload does) is not one.
CHANGES = frozenset({"created", "modified", "moved", "deleted", "closed"})


class Debounced:
    """Runs `action` on the loop once per burst of calls made within `delay` seconds."""

    def __init__(self, loop: asyncio.AbstractEventLoop, action: Trigger, delay: float) -> None:
        self._loop = loop
        self._action = action
        self._delay = delay
        self._pending: asyncio.TimerHandle | None = None

    def fire_threadsafe(self) -> None:
        """Callable from any thread."""
        self._loop.call_soon_threadsafe(self._arm)

    def _arm(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
        self._pending = self._loop.call_later(self._delay, self._run)

    def _run(self) -> None:
        self._pending = None
        spawn(self._action(), "file watch")


class _Handler(FileSystemEventHandler):
    def __init__(self, wanted: Callable[[FileSystemEvent], bool], fire: Callable[[], None]) -> None:
        self._wanted = wanted
        self._fire = fire

    def on_any_event(self, event: FileSystemEvent) -> None:
        if self._wanted(event):
            self._fire()


def _names(event: FileSystemEvent) -> set[str]:
    paths = {event.src_path, getattr(event, "dest_path", "") or ""}
    return {os.path.basename(os.fsdecode(p)) for p in paths if p}


class Watchers:
    """The config-directory and kubelet-directory observers of one running plugin."""

    def __init__(self) -> None:
        self._observer = Observer()
        self._started = False

    def watch_config(
        self,
        loop: asyncio.AbstractEventLoop,
        config_file: Path,
        on_change: Trigger,
        delay: float = 0.05,
    ) -> None:
        """Reload when the config file, or the ConfigMap's `..data` link, changes."""
        directory = config_file.parent
        debounced = Debounced(loop, on_change, delay)
        relevant = {config_file.name, "..data"}  # the file, or the ConfigMap's symlink swap

        def wanted(event: FileSystemEvent) -> bool:
            return event.event_type in CHANGES and bool(_names(event) & relevant)

        self._observer.schedule(_Handler(wanted, debounced.fire_threadsafe), str(directory))
        log_event(logger, "watch.config", directory=str(directory))

    def watch_kubelet(
        self,
        loop: asyncio.AbstractEventLoop,
        kubelet_dir: Path,
        our_sockets: Callable[[], Set[str]],
        on_change: Trigger,
        delay: float = 0.02,
    ) -> None:
        """Check the kubelet when kubelet.sock appears or goes, or one of our sockets goes."""
        debounced = Debounced(loop, on_change, delay)

        def wanted(event: FileSystemEvent) -> bool:
            names = _names(event)
            if KUBELET_SOCKET in names and event.event_type in ("created", "moved", "deleted"):
                return True
            return event.event_type in ("deleted", "moved") and bool(names & our_sockets())

        kubelet_dir.mkdir(parents=True, exist_ok=True)
        self._observer.schedule(_Handler(wanted, debounced.fire_threadsafe), str(kubelet_dir))
        log_event(logger, "watch.kubelet", directory=str(kubelet_dir))

    def start(self) -> None:
        self._observer.start()
        self._started = True

    def stop(self) -> None:
        if self._started:
            self._observer.stop()
            self._observer.join(timeout=2)
            self._started = False
