"""The timing logic of the DRA table of `make bench-reference` (bench/drareference.py): each
check is timed from the driver's fork to when it first held, and a driver that exits before
all of them held is a BenchError naming what was never seen."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, cast

import pytest
from test_node_config import in_loop

from bench.comparison import BenchError
from bench.drareference import Driver, first_held
from testbed.process import Child


def _driver(tmp_path: Path, argv: list[str]) -> Driver:
    child = Child(argv, tmp_path / "driver.log").start()
    return Driver("ours", child, cast(Any, None), cast(Any, None))


@in_loop
async def test_each_check_is_timed_from_the_fork_to_when_it_first_held(tmp_path: Path) -> None:
    driver = _driver(tmp_path, ["sleep", "30"])
    try:
        soon = driver.child.started + 0.05
        later = driver.child.started + 0.15
        seen = await first_held(
            driver,
            {"later": lambda: time.monotonic() >= later, "soon": lambda: time.monotonic() >= soon},
        )
    finally:
        driver.child.stop()
    assert 0.05 <= seen["soon"] < seen["later"]
    assert seen["later"] >= 0.15


@in_loop
async def test_a_driver_that_exits_first_names_what_was_never_seen(tmp_path: Path) -> None:
    driver = _driver(tmp_path, ["sh", "-c", "echo gone; exit 3"])
    try:
        with pytest.raises(BenchError, match=r"ours: registration not seen \(exited\):\ngone"):
            await first_held(driver, {"published": lambda: True, "registration": lambda: False})
    finally:
        driver.child.stop()
