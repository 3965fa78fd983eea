"""Puts the CDI spec on disk so that a runtime reading the directory at any moment sees either
the old file or the new one, never half of one, and never two.

The content goes to a temp file in the same directory, whose name ends neither in `.json` nor in
`.yaml` (runtimes read every such file, hidden ones too, and a duplicate definition makes the
device unresolvable), then is renamed over the spec. Mode 0644: the runtime may read it as
another user. A spec whose bytes are already on disk is not rewritten, so a runtime's cache and
the file's mtime say when something really changed. Errors are OSError for the caller to log
and retry; a directory that is a file is ENOTDIR naming it, not mkdir's EEXIST.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

SPEC_MODE = 0o644


def errno_name(err: OSError) -> str:
    """`EROFS`, `ENOSPC`, ...: the symbol an operator searches for; "" when there is none."""
    return errno.errorcode.get(err.errno or 0, "")


def describe(err: OSError) -> str:
    """`EROFS Read-only file system`: the errno's name and its text, for a per-call error."""
    return f"{errno_name(err)} {err.strerror or err}".strip()


def render(spec: Mapping[str, Any]) -> bytes:
    """The file's bytes: JSON, two-space indented, newline-terminated."""
    return (json.dumps(spec, indent=2) + "\n").encode()


class SpecWriter:
    """Writes and removes one spec file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, spec: Mapping[str, Any]) -> bool:
        """Make the file hold `spec`; True when it was (re)written, False when it already held
        exactly these bytes. Raises OSError (read-only directory, disk full, ...)."""
        content = render(spec)
        with contextlib.suppress(OSError):
            if self.path.read_bytes() == content:
                return False
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except FileExistsError:  # a file, not a directory, is in the way
            raise NotADirectoryError(
                errno.ENOTDIR, f"{self.path.parent} is not a directory", str(self.path.parent)
            ) from None
        import tempfile  # loaded when a spec is written, not by every start-up

        fd, temp = tempfile.mkstemp(
            dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp"
        )
        try:
            with os.fdopen(fd, "wb") as file:
                file.write(content)
                file.flush()
                os.fchmod(file.fileno(), SPEC_MODE)
                os.fsync(file.fileno())
            os.replace(temp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise
        return True

    def remove(self) -> bool:
        """Remove the file; True when there was one. Raises OSError other than "not there"."""
        try:
            self.path.unlink()
        except FileNotFoundError:
            return False
        return True
