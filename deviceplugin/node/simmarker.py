"""Whether a driver root is a tree `deviceplugin sim-root` laid out: its marker says so.

A real driver root (a GPU operator's, mounted at /run/nvidia/driver) can hold any file the
driver's container has, a `proc/` with the kernel module's files among them, so no file's
presence decides: only a marker file (`model.hostpaths.SIM_ROOT_MARKER`), a JSON object whose
`kind` is `SIM_ROOT`. The file is untrusted: only a small regular file is read, opened without
blocking, and anything else (absent, a FIFO, too big, not JSON, another kind) is a real root.
"""

from __future__ import annotations

import json
import os
import stat

from deviceplugin.model.hostpaths import SIM_ROOT, SIM_ROOT_MARKER, host_path

MAX_MARKER_BYTES = 4096


def is_sim_root(driver_root: str) -> bool:
    """True when `driver_root` carries a `sim-root` marker that says it is one."""
    try:
        fd = os.open(
            host_path(driver_root, SIM_ROOT_MARKER), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
        )
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        data = os.read(fd, MAX_MARKER_BYTES + 1)
    except OSError:
        return False
    finally:
        os.close(fd)
    if len(data) > MAX_MARKER_BYTES:
        return False
    try:
        document = json.loads(data)
    except ValueError:  # not UTF-8, not JSON
        return False
    return isinstance(document, dict) and document.get("kind") == SIM_ROOT
