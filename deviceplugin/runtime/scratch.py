"""Scratch dirs of a simulated host (`serve --simulate` lays its node's tree out in one).

In memory (/dev/shm) where the node has it: the tree lives as long as `serve`, and its hundred
inodes (device nodes, links, files) cost about 2 ms there against 6-36 ms on a disk's /tmp, most
of a simulated start-up's variance. Else in the temp dir ($TMPDIR, /tmp, ...).

A process killed outright (SIGKILL, OOM) cannot remove its dir, and in /dev/shm the dir holds
memory until the node reboots. So the process that makes a dir holds an exclusive `flock` on its
`.owner` file while it lives, and each new dir's maker first removes the dirs whose lock it can
take: their makers are gone, whatever PID namespace they ran in. A dir without `.owner` (still
being made, or made before owners were kept) is left alone.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
from collections.abc import Callable
from pathlib import Path

from deviceplugin.model.log import log_event

logger = logging.getLogger(__name__)

MEMORY_DIR = "/dev/shm"  # where scratch dirs go first
PREFIX = "dp-simhost-"
OWNER = ".owner"

_held: dict[str, int] = {}  # dir -> the descriptor whose lock says this process owns it


def make(fill: Callable[[Path], object]) -> str:
    """A new private dir, owned by this process and filled by `fill`; removed again if that
    fails. Dirs left by processes that are gone are removed first."""
    try:
        directory = _private_dir(MEMORY_DIR)
    except OSError:  # no /dev/shm here, or not writable
        import tempfile

        directory = tempfile.mkdtemp(prefix=PREFIX)
    try:
        _own(directory)
        _remove_abandoned(os.path.dirname(directory))
        fill(Path(directory))
    except BaseException:
        release(directory)
        raise
    return directory


def release(directory: str) -> None:
    """Remove a dir `make` made, then give up owning it."""
    import shutil  # loaded only when simulating

    shutil.rmtree(directory, ignore_errors=True)
    held = _held.pop(directory, None)
    if held is not None:
        os.close(held)


def _private_dir(parent: str) -> str:
    """A new dir under `parent` that only we can enter, named as `tempfile.mkdtemp` names
    one: importing tempfile, with the random module it loads, cost a simulated start-up 1 ms,
    half as much as laying out the tree."""
    for _ in range(100):
        path = os.path.join(parent, PREFIX + os.urandom(6).hex())
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        return os.path.abspath(path)
    raise FileExistsError(errno.EEXIST, "no unused name left", parent)


def _own(directory: str) -> None:
    """Lock `.owner` for as long as this process lives. It is locked under another name and
    renamed into place, so no sweeper ever finds it unlocked while its maker lives."""
    claiming = os.path.join(directory, OWNER + ".new")
    held = os.open(claiming, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        os.rename(claiming, os.path.join(directory, OWNER))
    except BaseException:
        os.close(held)
        raise
    _held[directory] = held


def _remove_abandoned(parent: str) -> None:
    """Remove the scratch dirs under `parent` whose owner lock can be taken: their makers are
    gone. Ours (locked through other descriptors) and other users' (unreadable) stay."""
    import shutil

    with contextlib.suppress(OSError), os.scandir(parent) as entries:
        names = [entry.path for entry in entries if entry.name.startswith(PREFIX)]
    for directory in names:
        if directory in _held:
            continue
        try:
            owner = os.open(os.path.join(directory, OWNER), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:  # no owner kept, or not ours to read
            continue
        try:
            fcntl.flock(owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # its maker lives
            os.close(owner)
            continue
        shutil.rmtree(directory, ignore_errors=True)
        os.close(owner)
        log_event(logger, "simulate.scratch.removed", directory=directory, reason="maker gone")
