"""Directory watches on one inotify descriptor read by the event loop (node/inotify.py): the
changes the file watches act on arrive on the loop, and no thread is started for them."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

from harness import inotify_descriptors, run

from deviceplugin.node.inotify import DirectoryEvent, DirectoryWatches


async def _settle(events: list[DirectoryEvent], count: int) -> None:
    for _ in range(200):
        if len(events) >= count:
            return
        await asyncio.sleep(0.01)


def test_changes_arrive_on_the_loop_without_a_thread(tmp_path: Path) -> None:
    async def body() -> list[tuple[str, str, bool]]:
        seen: list[DirectoryEvent] = []
        on_loop: list[bool] = []
        loop = asyncio.get_running_loop()

        def handle(event: DirectoryEvent) -> None:
            seen.append(event)
            on_loop.append(asyncio.get_running_loop() is loop)

        before = set(threading.enumerate())
        watches = DirectoryWatches(loop)
        watches.add(str(tmp_path), handle)
        watches.start()
        try:
            (tmp_path / "a").write_text("x")  # created, modified, closed
            os.rename(tmp_path / "a", tmp_path / "b")  # moved from a, moved to b
            (tmp_path / "b").unlink()  # deleted
            await _settle(seen, 6)
            assert set(threading.enumerate()) <= before  # none started; others may end
        finally:
            watches.close()
        return [(e.kind, e.name, ok) for e, ok in zip(seen, on_loop, strict=True)]

    assert run(body()) == [
        ("created", "a", True),
        ("modified", "a", True),
        ("closed", "a", True),
        ("moved", "a", True),
        ("moved", "b", True),
        ("deleted", "b", True),
    ]


def test_two_directories_share_one_descriptor_and_a_gone_directory_says_so(
    tmp_path: Path,
) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()

    async def body() -> tuple[int, list[DirectoryEvent]]:
        seen: list[DirectoryEvent] = []
        before = inotify_descriptors()
        watches = DirectoryWatches(asyncio.get_running_loop())
        watches.add(str(first), seen.append)
        watches.add(str(second), seen.append)
        watches.start()
        opened = inotify_descriptors() - before
        try:
            second.rmdir()
            await _settle(seen, 1)
        finally:
            watches.close()
        assert inotify_descriptors() == before
        return opened, seen

    opened, seen = run(body())
    assert opened == 1
    assert seen[0] == DirectoryEvent("deleted", str(second), "")
