"""What the engine gives both daemons alike, checked on each: the device plugin's supervisor
and the DRA driver, each running on the simulated node. A reload whose rediscovery fails is
refused whole (the config in force, the devices served and the engine's part of /status stay
as they were, the refusal reported), and a health monitor that died makes the daemon not
ready."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import pytest

import deviceplugin.runtime.engine
from deviceplugin.model.errors import NvmlError
from deviceplugin.runtime.engine import NodeEngine
from tests import harness
from tests.draplugin import running_driver


@dataclass
class Daemon:
    """One running daemon, as the tests here see it."""

    engine: NodeEngine
    reload: Callable[..., Any]
    not_ready: Callable[[], list[str]]
    served: Callable[[], object]  # what the daemon serves now, to compare before and after
    write_config: Callable[[str], None]


@contextlib.asynccontextmanager
async def plugin() -> AsyncIterator[Daemon]:
    async with harness.running_plugin() as running:
        supervisor = running.supervisor
        yield Daemon(
            supervisor.engine,
            supervisor.reload,
            lambda: supervisor.status().not_ready,
            lambda: dict(supervisor.resources),
            running.swap_config,
        )


@contextlib.asynccontextmanager
async def dra_driver() -> AsyncIterator[Daemon]:
    async with running_driver() as node:
        driver = node.driver
        config = node.root / "config.yaml"
        config.write_text("version: v1\n")
        driver.engine.config_file.path = str(config)  # before any reload: nothing else reads it
        yield Daemon(
            driver.engine,
            driver.reload,
            lambda: driver.status().not_ready,
            lambda: driver.preparer.devices if driver.preparer else None,
            config.write_text,
        )


DAEMONS = [pytest.param(plugin, id="device-plugin"), pytest.param(dra_driver, id="dra-driver")]


@pytest.mark.parametrize("running", DAEMONS)
def test_a_reload_whose_rediscovery_fails_changes_nothing(
    running: Callable[[], contextlib.AbstractAsyncContextManager[Daemon]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def body() -> None:
        async with running() as daemon:
            engine = daemon.engine
            config_before, inventory_before = engine.parsed, engine.inventory
            served_before = daemon.served()
            source_before = engine.core_status(True).config_source

            def lost(_: object, **options: object) -> None:
                raise NvmlError("nvmlDeviceGetCount: GPU is lost")

            monkeypatch.setattr(deviceplugin.runtime.engine, "discover", lost)
            daemon.write_config("version: v1\nflags:\n  failOnInitError: false\n")
            assert await daemon.reload("test", force=True) is False

            assert engine.parsed is config_before and engine.inventory is inventory_before
            assert daemon.served() == served_before
            core = engine.core_status(True)
            assert core.config_source == source_before
            assert core.last_config_error is not None and "GPU is lost" in core.last_config_error
            assert daemon.not_ready() == []  # serving the last good state is healthy

    harness.run(body())


@pytest.mark.parametrize("running", DAEMONS)
def test_a_dead_health_monitor_makes_the_daemon_not_ready(
    running: Callable[[], contextlib.AbstractAsyncContextManager[Daemon]],
) -> None:
    async def body() -> None:
        async with running() as daemon:
            assert daemon.not_ready() == []
            monitor = daemon.engine._monitor  # the worker thread, stopped as a crash would
            assert monitor is not None
            monitor.stop()
            assert "health monitor not running" in daemon.not_ready()

    harness.run(body())
