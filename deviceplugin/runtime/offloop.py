"""Work the event loop must neither wait for nor be stuck behind: reading and parsing the config
file, planning resources from it.

`OffLoop.run` runs a job on a daemon thread and gives up after a time limit, so a read that never
returns (a hung file system) or a parse of a huge document costs the loop nothing: Allocate,
`/healthz` and SIGTERM are served meanwhile, and a job that overran cannot hold up the process's
exit. A thread cannot be stopped, so until an overrunning job ends no other one is started: a
stuck file system costs one thread, not one per reload.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class OffLoop:
    """One job at a time on a daemon thread, each given at most `limit_seconds`."""

    def __init__(self, limit_seconds: float) -> None:
        self.limit_seconds = limit_seconds
        self._overrun: tuple[threading.Thread, str] | None = None

    async def run(self, job: Callable[[], T], what: str) -> T:
        """`job()`'s result or exception. Raises TimeoutError naming `what` when it takes longer
        than the limit, or when an earlier job that overran is still running."""
        if self._overrun is not None:
            thread, earlier = self._overrun
            if thread.is_alive():
                raise TimeoutError(
                    f"{earlier} has not finished after more than {self.limit_seconds:g} s; "
                    "nothing more is started until it does"
                )
            self._overrun = None
        loop = asyncio.get_running_loop()
        done: asyncio.Future[T] = loop.create_future()

        def work() -> None:
            try:
                result = job()
            except BaseException as exc:  # handed to the awaiting task, which re-raises it
                _settle(loop, done, functools.partial(done.set_exception, exc))
            else:
                _settle(loop, done, functools.partial(done.set_result, result))

        thread = threading.Thread(target=work, name=f"deviceplugin: {what}", daemon=True)
        thread.start()
        try:
            return await asyncio.wait_for(asyncio.shield(done), self.limit_seconds)
        except TimeoutError:
            self._overrun = (thread, what)
            done.add_done_callback(_forget)
            raise TimeoutError(f"{what} took longer than {self.limit_seconds:g} s") from None


def _forget(done: asyncio.Future[T]) -> None:
    """Retrieve the outcome of a job given up on, so asyncio does not report it as lost."""
    if not done.cancelled():
        done.exception()


def _settle(
    loop: asyncio.AbstractEventLoop, done: asyncio.Future[T], settle: Callable[[], None]
) -> None:
    """Settle `done` on its loop, unless it was given up on or the loop has closed since."""

    def apply() -> None:
        if not done.done():
            settle()

    with contextlib.suppress(RuntimeError):  # the loop closed while the job ran
        loop.call_soon_threadsafe(apply)
