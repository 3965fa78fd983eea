"""Scratch dirs of a simulated host (`runtime/scratch.py`): owned by the process that made them,
removed at its stop, and removed by the next maker once that process is gone, whatever killed
it; never while it lives."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from deviceplugin.runtime import scratch

DEVICEPLUGIN = str(Path(sys.executable).parent / "deviceplugin")
DRIVER_ROOT = re.compile(r'"nvidiaDriverRoot":"([^"]+)"')


@pytest.fixture
def memory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A stand-in for /dev/shm."""
    monkeypatch.setattr(scratch, "MEMORY_DIR", str(tmp_path))
    return tmp_path


def _left_behind(parent: Path, name: str, owner: bool = True) -> Path:
    """A scratch dir as a process that died would leave it."""
    directory = parent / f"{scratch.PREFIX}{name}"
    (directory / "dev").mkdir(parents=True)
    if owner:
        (directory / scratch.OWNER).touch()
    return directory


@contextlib.contextmanager
def _locked_elsewhere(directory: Path) -> Iterator[None]:
    """Another live process holding the dir's owner lock."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time\n"
            "fd = os.open(sys.argv[1], os.O_RDONLY)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "print('locked', flush=True)\n"
            "time.sleep(60)\n",
            str(directory / scratch.OWNER),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        yield
    finally:
        holder.kill()
        holder.wait()


def test_a_dir_is_owned_while_its_maker_lives_and_gone_at_release(memory: Path) -> None:
    made = Path(scratch.make(lambda d: (d / "dev").mkdir()))
    assert made.parent == memory and (made / "dev").is_dir()
    owner = os.open(made / scratch.OWNER, os.O_RDONLY)
    try:
        with pytest.raises(BlockingIOError):  # held through the maker's own descriptor
            fcntl.flock(owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(owner)
    scratch.release(str(made))
    assert not made.exists()
    assert str(made) not in scratch._held


def test_the_next_maker_removes_only_what_abandoned_makers_left(memory: Path) -> None:
    abandoned = _left_behind(memory, "abandoned")
    unowned = _left_behind(memory, "unowned", owner=False)  # being made, or from before owners
    other = memory / "not-ours"
    other.mkdir()
    alive = _left_behind(memory, "alive")
    with _locked_elsewhere(alive):
        mine = scratch.make(lambda d: None)
        second = scratch.make(lambda d: None)  # the first is this process's: it stays
        try:
            assert not abandoned.exists()
            assert unowned.is_dir() and other.is_dir() and alive.is_dir()
            assert Path(mine).is_dir() and Path(second).is_dir()
        finally:
            scratch.release(mine)
            scratch.release(second)


def test_a_failed_fill_leaves_nothing(memory: Path) -> None:
    def fail(directory: Path) -> None:
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        scratch.make(fail)
    assert list(memory.iterdir()) == []
    assert not scratch._held


def _driver_root(process: subprocess.Popen[str]) -> Path:
    """The simulated host's tree, from the `config.applied` line of a starting serve."""
    assert process.stderr is not None
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        found = DRIVER_ROOT.search(line)
        if found:
            return Path(found.group(1))
    raise AssertionError("serve never applied its config")


def test_a_tree_left_by_a_killed_serve_is_removed_by_the_next(tmp_path: Path) -> None:
    """The real case: SIGKILL leaves the tree in /dev/shm, the next simulated serve removes it,
    and a clean stop removes its own."""

    def serve(name: str) -> subprocess.Popen[str]:
        kubelet = tmp_path / name
        kubelet.mkdir()
        argv = [DEVICEPLUGIN, "serve", "--simulate", "a30-x4-mig", "--kubelet-dir", str(kubelet)]
        argv += ["--cdi-spec-dir", str(tmp_path / "cdi")]
        return subprocess.Popen(
            argv,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )

    killed = serve("first")
    try:
        left = _driver_root(killed)
    finally:
        killed.kill()
        killed.wait()
    assert (left / scratch.OWNER).is_file()
    follower = serve("second")
    try:
        own = _driver_root(follower)
        assert own != left and own.is_dir()
        assert not left.exists()
    finally:
        follower.send_signal(signal.SIGTERM)
        assert follower.wait(15) == 0
    assert not own.exists()
