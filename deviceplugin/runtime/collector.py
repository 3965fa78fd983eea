"""Garbage collection while a command starts.

Start-up makes some 30,000 objects that live as long as the process (modules, classes, the
config, the inventory) and little garbage, yet the collector walked them again and again while
they were made: some 60 passes, 6 to 8 ms of a simulated `serve`'s 0.13 s start. So `main` runs
a command with collection paused, and a daemon settles it once it serves: one full pass then
(about 10 ms, once the first registrations are answered) and collection as usual from there on.
A daemon whose start waits (an API server that is down) settles it after a few seconds anyway,
so what its retries leave behind is collected.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

SETTLE_SECONDS = 1.0  # after a daemon serves: its registrations are answered well before
LONGEST_PAUSE_SECONDS = 10.0  # after a daemon's run began, served or not: garbage stays bounded

_paused = False


@contextmanager
def paused_for_start_up() -> Iterator[None]:
    """No collection inside until `settle` ends the pause; collection as before on the way out
    (a one-shot command, a failed start). Nothing changes where collection was already off."""
    global _paused
    if not gc.isenabled():
        yield
        return
    gc.disable()
    _paused = True
    try:
        yield
    finally:
        if _paused:
            _paused = False
            gc.enable()


def settle() -> None:
    """End the start-up pause: collect what start-up left, and collect as usual from now on.
    Nothing outside a pause (a daemon that tests run in their own process)."""
    global _paused
    if not _paused:
        return
    _paused = False
    gc.collect()
    gc.enable()
