"""The program behind the command line (`__main__`): parse, set up logging, run the command, map
errors to exit codes.

This is the one place that decides how the process ends: 0 on a clean stop, 1 on an
unexpected internal error (or NVML unavailable with failOnInitError), 2 on bad usage or an
invalid configuration at start-up.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from deviceplugin.cli import SERVE_ENV_VARS, parse_options
from deviceplugin.model.errors import ConfigError, DiscoveryError, NvmlError
from deviceplugin.model.log import log_event
from deviceplugin.ops.logs import configure
from deviceplugin.runtime import options as command_options

if TYPE_CHECKING:
    from deviceplugin.runtime.host import Simulator

logger = logging.getLogger("deviceplugin")


def _simulator(source: str | None) -> Simulator | None:
    """The simulated node a daemon's `--simulate` names, built here and handed down; the
    simulator's package is loaded only then, never by a daemon on a real node."""
    if source is None:
        return None
    from deviceplugin.sim.simulator import NodeSimulator

    return NodeSimulator(source)


def _run(options: command_options.CommandOptions) -> int:
    if isinstance(options, command_options.ValidateConfigOptions):
        from deviceplugin.commands import validate_config

        return validate_config(options)
    if isinstance(options, command_options.InspectOptions):
        from deviceplugin.plugin.inspect import inspect

        return inspect(options)
    if isinstance(options, command_options.CdiSpecOptions):
        from deviceplugin.commands import cdi_spec

        return cdi_spec(options)
    if isinstance(options, command_options.SimRootOptions):
        from deviceplugin.commands import sim_root

        return sim_root(options)
    if isinstance(options, command_options.ExplainOptions):
        from deviceplugin.explain.command import explain

        return explain(options)
    if isinstance(options, command_options.DraServeOptions):
        from deviceplugin.dra.service import serve_dra

        asyncio.run(serve_dra(options, _simulator(options.simulate)))
        return 0
    if isinstance(options, command_options.DraDemoOptions):
        from deviceplugin.demos.dra import main as dra_demo

        return dra_demo(SERVE_ENV_VARS)
    if isinstance(options, command_options.ServeOptions):
        from deviceplugin.plugin.service import serve

        asyncio.run(serve(options, _simulator(options.simulate)))
        return 0
    from deviceplugin.demos.plugin import demo

    return asyncio.run(demo())


# What each optional dependency is installed with (pyproject's extras).
EXTRAS = {
    "aiohttp": "sim",  # the API-server stand-in (`dra demo`) serves with it
    "pydantic": "dra",
    "pydantic_core": "dra",
    "cel_expr_python": "cel",
    "kubernetes_validate": "sim",
}


def main(argv: Sequence[str]) -> int:
    settings = parse_options(argv, os.environ)
    configure(settings.log_format)
    try:
        return _run(settings)
    except ModuleNotFoundError as exc:
        top = (exc.name or "").partition(".")[0]
        if top not in EXTRAS:
            logger.exception("internal.error")
            return 1
        log_event(
            logger,
            "startup.missing_dependency",
            logging.ERROR,
            command=settings.command,
            module=top,
            hint=f"install the {EXTRAS[top]!r} extra: pip install 'deviceplugin[{EXTRAS[top]}]'",
        )
        return 2
    except (ConfigError, DiscoveryError) as exc:
        field = exc.path if isinstance(exc, ConfigError) else ""
        log_event(logger, "startup.invalid", logging.ERROR, field=field, error=str(exc))
        return 2
    except NvmlError as exc:
        log_event(
            logger,
            "nvml.init.failed",
            logging.ERROR,
            error=str(exc),
            hint="is the NVIDIA driver loaded and the container run with the NVIDIA runtime? "
            "set failOnInitError: false to idle on nodes without GPUs",
        )
        return 1
    except KeyboardInterrupt:
        return 0
    except Exception:
        logger.exception("internal.error")
        return 1
