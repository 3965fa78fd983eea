"""`serve`: the supervisor wired to signals, file watchers and periodic checks, until stopped.

SIGTERM/SIGINT stop the plugin (servers stopped, sockets removed, NVML shut down); SIGHUP forces
a reload. Watchers catch ConfigMap swaps and kubelet restarts at once; a cheap periodic check
catches what they cannot see (a MIG re-cut, a missed file event).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from pathlib import Path
from typing import TYPE_CHECKING

from deviceplugin.kubelet.registration import KUBELET_SOCKET
from deviceplugin.model.log import log_event
from deviceplugin.ops.metrics import Metrics, NoMetrics
from deviceplugin.plugin.supervisor import Supervisor
from deviceplugin.runtime.background import periodically, spawn
from deviceplugin.runtime.engine import REDISCOVER_SECONDS, SOCKET_CHECK_SECONDS
from deviceplugin.runtime.options import ServeOptions
from deviceplugin.runtime.watch import Watchers

if TYPE_CHECKING:
    from deviceplugin.ops.http import HttpServer
    from deviceplugin.runtime.nodeagent import NodeAgent

logger = logging.getLogger(__name__)


async def _often(supervisor: Supervisor) -> None:
    """Check the kubelet's sockets and retry a CDI spec that could not be written."""
    await supervisor.check_kubelet("periodic check")
    await supervisor.retry_cdi_spec()


async def run_supervisor(supervisor: Supervisor, http: HttpServer | None = None) -> None:
    """Start the supervisor and keep it reacting until `request_stop`; always cleans up.

    HTTP (`http`, or one built from `--http-address`) listens before start-up begins, so
    /healthz answers and /readyz says "starting" while devices are discovered and registered.
    """
    loop = asyncio.get_running_loop()
    settings = supervisor.settings
    if http is None and settings.http_address:
        # The HTTP stack and the pod-resources client only for a plugin that serves HTTP.
        from deviceplugin.kubelet.pods import pod_resources_socket, read_pods
        from deviceplugin.ops.http import HttpServer

        http = HttpServer(
            settings.http_address,
            supervisor,
            pod_resources_socket(settings.kubelet_dir),
            read_pods=read_pods,
        )
    watchers = Watchers()
    periodic: asyncio.Task[None] | None = None
    node: NodeAgent | None = None
    try:
        if http is not None:
            await http.start()
        if settings.follows_node:  # only then: the API client is imported by no other serve
            from deviceplugin.runtime.nodeagent import NodeAgent

            node = NodeAgent(settings.node_options, supervisor)
            await node.start()
        await supervisor.start()
        if node is not None:
            node.serving()
        if node is not None and settings.config_dir:
            watchers.watch_config(loop, node.config_path, node.config_changed)
        elif settings.config_file:
            watchers.watch_config(
                loop, Path(settings.config_file), lambda: supervisor.reload("config file changed")
            )
        watchers.watch_kubelet(
            loop,
            settings.kubelet_dir / KUBELET_SOCKET,
            supervisor.our_sockets,
            lambda: supervisor.check_kubelet("kubelet directory changed"),
        )
        watchers.start()
        periodic = loop.create_task(
            periodically(
                lambda: _often(supervisor),
                supervisor.rediscover,
                SOCKET_CHECK_SECONDS,
                REDISCOVER_SECONDS,
                "periodic.failed",
            )
        )
        log_event(logger, "plugin.started", resources=sorted(supervisor.resources))
        await supervisor.wait_stopped()
    finally:
        if periodic is not None:
            periodic.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await periodic
        await asyncio.to_thread(watchers.stop)
        if node is not None:
            await node.stop()
        try:
            await supervisor.shutdown()
        finally:
            if http is not None:
                await http.stop()


async def serve(settings: ServeOptions) -> None:
    """The `serve` command: run until SIGTERM or SIGINT."""
    loop = asyncio.get_running_loop()
    supervisor = Supervisor(settings, Metrics() if settings.http_address else NoMetrics())
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, supervisor.request_stop)
    loop.add_signal_handler(
        signal.SIGHUP, lambda: spawn(supervisor.reload("SIGHUP", force=True), "SIGHUP")
    )
    await run_supervisor(supervisor)
