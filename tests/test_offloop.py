"""OffLoop: jobs on daemon threads with a time limit, one overrunning job at most."""

from __future__ import annotations

import asyncio
import threading

import pytest

from deviceplugin.runtime.offloop import OffLoop


def job_threads(what: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"deviceplugin: {what}"]


def test_a_result_and_an_exception_come_back_to_the_loop() -> None:
    async def scenario() -> None:
        worker = OffLoop(30)
        assert await worker.run(lambda: threading.current_thread().name, "naming") == (
            "deviceplugin: naming"
        )

        def fail() -> None:
            raise ValueError("bad input")

        with pytest.raises(ValueError, match="bad input"):
            await worker.run(fail, "failing")

    asyncio.run(scenario())


def test_an_overrunning_job_is_given_up_and_blocks_the_next_until_it_ends() -> None:
    release = threading.Event()

    async def scenario() -> None:
        worker = OffLoop(0.2)
        with pytest.raises(TimeoutError, match=r"^reading /stuck took longer than 0.2 s$"):
            await worker.run(release.wait, "reading /stuck")
        stuck = job_threads("reading /stuck")
        assert len(stuck) == 1 and stuck[0].daemon, "an overrun cannot hold up the exit"
        with pytest.raises(TimeoutError, match="reading /stuck has not finished"):
            await worker.run(lambda: 1, "reading /next")
        assert job_threads("reading /next") == [], "nothing more started meanwhile"
        release.set()
        await asyncio.to_thread(stuck[0].join)
        assert await worker.run(lambda: 2, "reading /next") == 2

    asyncio.run(scenario())


def test_the_loop_runs_while_a_job_does() -> None:
    started, release = threading.Event(), threading.Event()

    def job() -> str:
        started.set()
        release.wait()
        return "done"

    async def scenario() -> None:
        worker = OffLoop(30)
        running = asyncio.ensure_future(worker.run(job, "a long parse"))
        await asyncio.to_thread(started.wait)  # the loop turns while the job holds its thread
        assert not running.done()
        release.set()
        assert await running == "done"

    asyncio.run(scenario())
