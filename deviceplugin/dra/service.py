"""`dra serve`: the DRA driver (`dra/driver.py`) on the run loop both daemons share
(`runtime.run`): signals, HTTP, its config file's watch and periodic checks, until stopped.

SIGTERM/SIGINT stop the driver (both sockets removed, NVML shut down); SIGHUP forces a reload.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from deviceplugin.dra.driver import DraDriver
from deviceplugin.ops.drametrics import DraMetrics, NoDraMetrics
from deviceplugin.runtime.host import Simulator
from deviceplugin.runtime.options import DraServeOptions
from deviceplugin.runtime.run import run_daemon

if TYPE_CHECKING:
    from deviceplugin.runtime.run import Endpoints


async def run_driver(
    driver: DraDriver, http: Endpoints | None = None, signals: bool = False
) -> None:
    """Run `driver` until its engine is asked to stop: its HTTP endpoints (`http`, or those of
    `--http-address`), its config file watched, its periodic checks. Everything started is
    stopped again, in reverse order, however this ends. HTTP listens before start-up begins, so
    /healthz answers and /readyz says "starting" meanwhile."""
    settings = driver.settings
    await run_daemon(
        driver,
        settings,
        often=driver.check_node,
        failed_event="dra.periodic.failed",
        http=http,
        signals=signals,
        follows_node=settings.config_dir is not None,  # the node's label chooses the config
    )


async def serve_dra(settings: DraServeOptions, simulator: Simulator | None = None) -> None:
    """The `dra serve` command: run until SIGTERM or SIGINT; SIGHUP reloads the config file.
    On the `simulator`'s node if given."""
    metrics = DraMetrics() if settings.http_address else NoDraMetrics()
    await run_driver(DraDriver(settings, metrics, simulator), signals=True)
