"""The run loop both daemons share: a daemon started, kept reacting, and stopped again.

`run_daemon` is the one entry point of `serve` and `dra serve`: it installs the signals (SIGTERM
and SIGINT ask the daemon's engine to stop, its one stop request; SIGHUP forces a reload) and
the daemon's HTTP endpoints. The stop request is
honoured at any point, start-up included: a start still waiting when it comes is cancelled.

In this order: the HTTP endpoints listen first (so /healthz answers and /readyz says "starting"
while the node is read), the own Node is followed when asked (`--config-dir`, `--gpu-labels`),
the daemon starts, its config file (or the named config its Node's label chooses) is watched,
and the periodic checks run: a cheap one every SOCKET_CHECK_SECONDS, a rediscovery every
REDISCOVER_SECONDS; a moment later garbage collection, paused for the start-up, resumes
(`collector.settle`). Whatever was started is stopped again in reverse order, however this ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from deviceplugin.runtime import collector, engine
from deviceplugin.runtime.background import periodically, spawn
from deviceplugin.runtime.options import DaemonOptions
from deviceplugin.runtime.watch import Watchers

if TYPE_CHECKING:  # the own Node's follower is loaded only where a daemon follows its Node
    from deviceplugin.runtime.nodeagent import Follower

    class Daemon(Follower, Protocol):
        """What the run loop drives: the device plugin's supervisor or the DRA driver."""

        async def start(self) -> None: ...

        async def stop(self) -> None: ...

        async def rediscover(self) -> bool: ...

        def endpoints(self, address: str) -> Endpoints:
            """The daemon's HTTP endpoints on `address` (`--http-address`)."""
            ...


class Endpoints(Protocol):
    """An HTTP server a daemon is operated through."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def install_signals(daemon: Daemon) -> None:
    """SIGTERM and SIGINT ask the daemon's engine to stop; SIGHUP forces a reload."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, daemon.engine.request_stop)
    loop.add_signal_handler(
        signal.SIGHUP, lambda: spawn(daemon.reload("SIGHUP", force=True), "SIGHUP")
    )


async def run_daemon(
    daemon: Daemon,
    options: DaemonOptions,
    *,
    often: Callable[[], Awaitable[object]],
    failed_event: str,
    http: Endpoints | None = None,
    signals: bool = False,
    follows_node: bool = False,
    watch: Callable[[Watchers, asyncio.AbstractEventLoop], None] | None = None,
    started: Callable[[], None] | None = None,
) -> None:
    """Run `daemon` until its engine is asked to stop; `daemon.stop()` stops it. With
    `signals`, SIGTERM, SIGINT and SIGHUP are installed (`install_signals`); HTTP is `http`, or
    the daemon's endpoints on `--http-address`. `often` is the cheap periodic check (its
    failures logged as `failed_event`), `watch` adds the daemon's own watches and `started` is
    told once everything runs."""
    loop = asyncio.get_running_loop()
    stop_requested = daemon.engine.wait_stopped
    if signals:
        install_signals(daemon)
    if http is None and options.http_address:
        http = daemon.endpoints(options.http_address)
    async with contextlib.AsyncExitStack() as running:
        # start-up's pause of garbage collection ends a moment after the daemon serves, and at
        # the latest after LONGEST_PAUSE_SECONDS (a start that waits on an API server that is down)
        running.callback(loop.call_later(collector.LONGEST_PAUSE_SECONDS, collector.settle).cancel)
        if http is not None:
            await http.start()
            running.push_async_callback(http.stop)
        running.push_async_callback(daemon.stop)
        node = None
        if follows_node:  # only then: the API client is imported by no other daemon
            from deviceplugin.runtime.nodeagent import NodeAgent

            node = NodeAgent(options.node_options, daemon)
            running.push_async_callback(node.stop)
            if not await _until_stopped(node.start(), stop_requested):
                return
        if not await _until_stopped(daemon.start(), stop_requested):
            return
        if node is not None:
            node.serving()
        watchers = Watchers()
        running.push_async_callback(asyncio.to_thread, watchers.stop)
        if node is not None and options.config_dir:
            watchers.watch_config(loop, node.config_path, node.config_changed)
        elif options.config_file:
            watchers.watch_config(
                loop, Path(options.config_file), lambda: daemon.reload("config file changed")
            )
        if watch is not None:
            watch(watchers, loop)
        watchers.start()
        checks = loop.create_task(
            periodically(
                often,
                daemon.rediscover,
                engine.SOCKET_CHECK_SECONDS,
                engine.REDISCOVER_SECONDS,
                failed_event,
            )
        )
        running.push_async_callback(_cancel, checks)
        running.callback(loop.call_later(collector.SETTLE_SECONDS, collector.settle).cancel)
        if started is not None:
            started()
        await stop_requested()


async def _until_stopped(
    step: Awaitable[None], stop_requested: Callable[[], Awaitable[None]]
) -> bool:
    """Run `step` to its end: True. False when a stop is requested first (the step is
    cancelled): SIGTERM never waits for a start-up step."""
    work = asyncio.ensure_future(step)
    stop = asyncio.ensure_future(stop_requested())
    try:
        await asyncio.wait({work, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
    if work.done():
        work.result()  # start-up's errors leave as they are: exit codes
        return True
    await _cancel(work)
    return False


async def _cancel(task: asyncio.Future[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
