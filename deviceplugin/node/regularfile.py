"""Opening untrusted files of the host without ever blocking: the config file, the DRA
checkpoint, the simulator's node and events files.

Each is a path that may name anything: a FIFO would block `open` until a writer comes (and
whatever waits behind it), `/dev/zero` never ends. A file is opened non-blocking and checked on
the open descriptor, so whatever is swapped in at any moment is refused with a reason instead
of read, and it is read in bounded chunks up to a limit.
"""

from __future__ import annotations

import errno
import os
import stat

_NOT_REGULAR = (
    (stat.S_ISLNK, "a symbolic link"),  # only where links are not followed
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class NotRegularError(OSError):
    """The path names something other than a regular file."""


def not_regular(mode: int) -> str | None:
    """What a file of `mode` is when it is not a regular file ("a named pipe (FIFO)"); None
    for a regular file."""
    return next((kind for test, kind in _NOT_REGULAR if test(mode)), None)


def open_regular(path: str, follow_symlinks: bool = True) -> tuple[int, os.stat_result]:
    """A read-only descriptor of the regular file at `path` and its status. Raises OSError
    (NotRegularError for a FIFO, device, directory or socket, and a symbolic link when
    `follow_symlinks` is false)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags if follow_symlinks else flags | os.O_NOFOLLOW)
    except OSError as err:
        if err.errno == errno.ELOOP and not follow_symlinks:
            raise NotRegularError(f"{path} is a symbolic link, not a regular file") from None
        raise
    try:
        info = os.fstat(fd)
        kind = not_regular(info.st_mode)
        if kind is not None:
            raise NotRegularError(f"{path} is {kind}, not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd, info


def read_regular(path: str, limit: int, follow_symlinks: bool = True) -> bytes:
    """The whole regular file at `path`, refused (ValueError) when it holds more than `limit`
    bytes, even if it grows while read. Raises OSError when it cannot be read (NotRegularError
    as `open_regular`)."""
    fd, info = open_regular(path, follow_symlinks)
    try:
        if info.st_size > limit:
            raise ValueError(f"{path}: {info.st_size} bytes, over the limit of {limit}")
        data = read_at_most(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise ValueError(f"{path}: it grew over the limit of {limit} bytes while read")
    return data


def read_at_most(fd: int, limit: int) -> bytes:
    """Up to `limit` bytes from the descriptor's position, in bounded chunks."""
    chunks: list[bytes] = []
    total = 0
    while total < limit:
        chunk = os.read(fd, min(65536, limit - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)
