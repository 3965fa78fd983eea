"""`periodically`: the checks run on their schedules and survive a failing turn."""

from __future__ import annotations

import asyncio
import logging

import pytest

from deviceplugin.runtime.background import periodically


def test_checks_keep_their_schedule_past_a_failing_turn(caplog: pytest.LogCaptureFixture) -> None:
    often_calls: list[int] = []
    rarely_calls: list[int] = []

    async def often() -> None:
        often_calls.append(len(often_calls))
        if len(often_calls) == 2:
            raise RuntimeError("one bad turn")

    async def rarely() -> None:
        rarely_calls.append(len(often_calls))

    async def body() -> None:
        task = asyncio.get_running_loop().create_task(
            periodically(often, rarely, 0.01, 0.03, "test.periodic.failed")
        )
        while len(often_calls) < 9:
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    with caplog.at_level(logging.ERROR):
        asyncio.run(body())
    assert len(often_calls) >= 9  # the failure on turn 2 did not end the checks
    assert any(r.message == "test.periodic.failed" for r in caplog.records)
    assert rarely_calls[:2] == [3, 6]  # every third turn, the failing one included in the count


def test_a_cheap_check_that_always_fails_never_starves_rediscovery() -> None:
    rarely_calls: list[float] = []

    async def often() -> None:
        raise RuntimeError("the kubelet directory is gone")

    async def rarely() -> None:
        rarely_calls.append(asyncio.get_running_loop().time())

    async def body() -> None:
        task = asyncio.get_running_loop().create_task(
            periodically(often, rarely, 0.01, 0.03, "test.periodic.failed")
        )
        while len(rarely_calls) < 3:
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(asyncio.wait_for(body(), 5))
    assert len(rarely_calls) >= 3
