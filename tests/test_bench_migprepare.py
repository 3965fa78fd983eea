"""What bench/migprepare.py counts on: every timed Prepare on the dynamic node cuts a new
partition (one per 1g.10gb placement of the 8 A100s), and each round's Unprepare destroys them
all, or the next round's Prepare of the same placements would fail as taken and the bench
would report an error instead of figures."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import pytest

from bench import migprepare


@pytest.mark.slow
def test_two_rounds_cut_every_1g10gb_placement_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(migprepare, "ROUNDS", 2)
    with tempfile.TemporaryDirectory(prefix="dpbm", dir="/tmp") as root:  # short socket paths
        node = Path(root) / "node"
        times = asyncio.run(migprepare.prepares(node, "dynamic", migprepare.ONE_G))
    assert len(times) == 2 * 8 * 7
    assert all(t > 0 for t in times)
