"""`dra serve`: the DRA driver (`dra/driver.py`) wired to signals, its config file's watch
and periodic checks, until stopped.

SIGTERM/SIGINT stop the driver (both sockets removed, NVML shut down); SIGHUP forces a reload.
The signals and the run loop are the ones `serve` has too (`runtime.run`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from deviceplugin.dra.driver import DraDriver
from deviceplugin.ops.drametrics import DraMetrics, NoDraMetrics
from deviceplugin.runtime.host import Simulator
from deviceplugin.runtime.options import DraServeOptions
from deviceplugin.runtime.run import install_signals, run_daemon

if TYPE_CHECKING:
    from deviceplugin.ops.http import EndpointServer


async def run_driver(driver: DraDriver, http: EndpointServer | None = None) -> None:
    """Run `driver` until its engine is asked to stop: its HTTP endpoints (`http`, or those of
    `--http-address`), its config file watched, its periodic checks. Everything started is
    stopped again, in reverse order, however this ends. HTTP listens before start-up begins, so
    /healthz answers and /readyz says "starting" meanwhile."""
    settings = driver.settings
    if http is None and settings.http_address:
        from deviceplugin.ops.http import DraEndpoints, EndpointServer  # only a driver with HTTP

        http = EndpointServer(settings.http_address, DraEndpoints(driver))
    await run_daemon(
        driver,
        settings,
        often=driver.check_node,
        failed_event="dra.periodic.failed",
        http=http,
        follows_node=settings.config_dir is not None,  # the node's label chooses the config
    )


async def serve_dra(settings: DraServeOptions, simulator: Simulator | None = None) -> None:
    """The `dra serve` command: run until SIGTERM or SIGINT; SIGHUP reloads the config file.
    On the `simulator`'s node if given."""
    metrics = DraMetrics() if settings.http_address else NoDraMetrics()
    driver = DraDriver(settings, metrics, simulator)
    install_signals(driver)
    await run_driver(driver)
