"""Garbage collection while a command starts (`runtime/collector.py`): paused from `main` on,
resumed once a daemon serves or when a one-shot command ends, left alone where it was off."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deviceplugin.__main__ import main
from deviceplugin.runtime import collector
from deviceplugin.runtime.options import DaemonOptions
from deviceplugin.runtime.run import run_daemon
from tests.harness import running_plugin

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def passes() -> Iterator[list[int]]:
    """The generations of the collector's passes while the test runs."""
    seen: list[int] = []

    def note(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            seen.append(info["generation"])

    gc.callbacks.append(note)
    try:
        yield seen
    finally:
        gc.callbacks.remove(note)
        gc.enable()


# Run in a fresh interpreter, where `main` still has every module to import.
_COUNT_PASSES = """
import gc, sys
from deviceplugin.__main__ import main
import deviceplugin.runtime.collector  # what main imports before it pauses collection
gc.collect()  # the young generation starts empty, so no pass is owed when main begins
seen = []
gc.callbacks.append(lambda phase, info: phase == "start" and seen.append(info["generation"]))
code = main(["validate-config", sys.argv[1]])
print(code, len(seen), gc.isenabled())
"""


def test_a_command_imports_and_runs_with_collection_paused(tmp_path: Path) -> None:
    """Without the pause, importing and running `validate-config` took some 35 passes; with it,
    the one pass left is the one owed when collection resumes on the way out."""
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\nflags:\n  migStrategy: mixed\n")
    ran = subprocess.run(
        [sys.executable, "-c", _COUNT_PASSES, str(config)],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    code, passes, enabled = ran.stdout.splitlines()[-1].split()
    assert (code, enabled) == ("0", "True")
    assert int(passes) <= 1


def test_collection_works_again_after_a_command(passes: list[int], tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\n")
    assert main(["validate-config", str(config)]) == 0
    assert gc.isenabled()
    garbage: list[object] = []
    garbage.append(garbage)  # a cycle only the collector frees
    del garbage
    assert gc.collect() >= 1 and passes


def test_a_failed_start_resumes_collection(passes: list[int], tmp_path: Path) -> None:
    assert main(["validate-config", str(tmp_path / "missing.yaml")]) == 2
    assert gc.isenabled()


def test_collection_left_off_stays_off() -> None:
    gc.disable()
    try:
        with collector.paused_for_start_up():
            collector.settle()
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


async def _collecting_again(timeout: float = 5.0) -> None:
    """Until the pause ends; fails after `timeout` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not gc.isenabled():
        assert asyncio.get_running_loop().time() < deadline, "collection never resumed"
        await asyncio.sleep(0.05)


def test_a_daemon_settles_collection_once_it_serves(
    passes: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Paused through discovery and registration; one full pass a moment after the plugin
    serves, then collection as usual while the pause has not even ended."""
    monkeypatch.setattr(collector, "SETTLE_SECONDS", 0.2)

    async def body() -> tuple[list[int], list[int]]:
        async with running_plugin() as plugin:
            assert plugin.settled()
            at_start = list(passes)
            await _collecting_again()
            return at_start, list(passes)

    with collector.paused_for_start_up():
        at_start, settled = asyncio.run(body())
        assert gc.isenabled()
    assert at_start == []
    assert settled[:1] == [2]  # the one full pass
    assert gc.isenabled()


class _StuckEngine:
    """An engine never asked to stop."""

    async def wait_stopped(self) -> None:
        await asyncio.Event().wait()


class _StuckDaemon:
    """A daemon whose start waits forever (a start-up step that never ends)."""

    engine = _StuckEngine()

    async def start(self) -> None:
        await asyncio.Event().wait()

    async def stop(self) -> None:
        pass


def test_a_start_that_never_ends_still_resumes_collection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(collector, "LONGEST_PAUSE_SECONDS", 0.2)

    async def nothing() -> None:
        pass

    async def body() -> None:
        running = asyncio.get_running_loop().create_task(
            run_daemon(
                _StuckDaemon(),  # type: ignore[arg-type]
                DaemonOptions(),
                often=nothing,
                failed_event="test.failed",
            )
        )
        try:
            await _collecting_again()
        finally:
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running

    with collector.paused_for_start_up():
        asyncio.run(body())
        assert gc.isenabled()
