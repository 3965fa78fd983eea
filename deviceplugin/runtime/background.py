"""Background work on the event loop: fire-and-forget tasks kept referenced with their failures
logged (`spawn`), and periodic checks that outlive a failed turn (`periodically`).

asyncio keeps only a weak reference to a task: one nobody holds can vanish mid-flight, and an
exception in it surfaces, if ever, as "Task exception was never retrieved". Every trigger the
plugin starts in the background goes through `spawn` instead.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from deviceplugin.model.log import log_exception

logger = logging.getLogger(__name__)

_running: set[asyncio.Task[Any]] = set()


def spawn(coroutine: Coroutine[Any, Any, Any], what: str) -> asyncio.Task[Any]:
    """Run `coroutine` in the background on the running loop; log it if it fails."""
    task = asyncio.get_running_loop().create_task(coroutine)
    _running.add(task)
    task.add_done_callback(lambda done: _finished(done, what))
    return task


def _finished(task: asyncio.Task[Any], what: str) -> None:
    _running.discard(task)
    if task.cancelled():
        return
    error = task.exception()
    if error is not None:
        log_exception(logger, "trigger.failed", error, trigger=what)


async def periodically(
    often: Callable[[], Awaitable[object]],
    rarely: Callable[[], Awaitable[object]],
    often_seconds: float,
    rarely_seconds: float,
    failed_event: str,
) -> None:
    """Run `often` every `often_seconds` and `rarely` about every `rarely_seconds` after it,
    until cancelled. A failing check is logged as `failed_event` and the checks go on: one bad
    turn must not end them for good, and a cheap check that always fails never keeps the rare
    one from running."""
    elapsed = 0.0
    while True:
        await asyncio.sleep(often_seconds)
        elapsed += often_seconds
        await _logged(often, failed_event)
        if elapsed >= rarely_seconds:
            elapsed = 0.0
            await _logged(rarely, failed_event)


async def _logged(check: Callable[[], Awaitable[object]], failed_event: str) -> None:
    try:
        await check()
    except Exception:
        log_exception(logger, failed_event, check=getattr(check, "__name__", repr(check)))
