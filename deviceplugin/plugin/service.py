"""`serve`: the supervisor wired to signals, file watchers and periodic checks, until stopped.

SIGTERM/SIGINT stop the plugin (servers stopped, sockets removed, NVML shut down); SIGHUP forces
a reload (`runtime.run`, as for `dra serve`). Watchers catch ConfigMap swaps and kubelet
restarts at once; a cheap periodic check catches what they cannot see (a MIG re-cut, a missed
file event) and follows the GPUs prepared DRA claims hold (`draholds`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from deviceplugin.kubelet.registration import KUBELET_SOCKET
from deviceplugin.model.log import log_event
from deviceplugin.ops.metrics import Metrics, NoMetrics
from deviceplugin.plugin.supervisor import Supervisor
from deviceplugin.runtime.host import Simulator
from deviceplugin.runtime.options import ServeOptions
from deviceplugin.runtime.run import run_daemon
from deviceplugin.runtime.watch import Watchers

if TYPE_CHECKING:
    from deviceplugin.runtime.run import Endpoints

logger = logging.getLogger(__name__)


async def _often(supervisor: Supervisor) -> None:
    """Check the kubelet's sockets, retry a CDI spec that could not be written, and follow what
    prepared DRA claims hold."""
    await supervisor.check_kubelet("periodic check")
    await supervisor.retry_cdi_spec()
    await supervisor.check_dra_holds()


async def run_supervisor(
    supervisor: Supervisor, http: Endpoints | None = None, signals: bool = False
) -> None:
    """Start the supervisor and keep it reacting until its engine is asked to stop; always
    cleans up. HTTP (`http`, or the supervisor's endpoints on `--http-address`) listens before
    start-up begins, so /healthz answers and /readyz says "starting" while devices are
    discovered and registered."""
    settings = supervisor.settings

    def watch_kubelet(watchers: Watchers, loop: asyncio.AbstractEventLoop) -> None:
        watchers.watch_kubelet(
            loop,
            settings.kubelet_dir / KUBELET_SOCKET,
            supervisor.our_sockets,
            lambda: supervisor.check_kubelet("kubelet directory changed"),
        )

    await run_daemon(
        supervisor,
        settings,
        often=lambda: _often(supervisor),
        failed_event="periodic.failed",
        http=http,
        signals=signals,
        follows_node=settings.follows_node,
        watch=watch_kubelet,
        started=lambda: log_event(logger, "plugin.started", resources=sorted(supervisor.resources)),
    )


async def serve(settings: ServeOptions, simulator: Simulator | None = None) -> None:
    """The `serve` command: run until SIGTERM or SIGINT, on the `simulator`'s node if given;
    SIGHUP reloads the config file."""
    metrics = Metrics() if settings.http_address else NoMetrics()
    await run_supervisor(Supervisor(settings, metrics, simulator), signals=True)
