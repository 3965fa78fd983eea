"""`<mpsRoot>/shm`, the memory an MPS daemon shares with its clients: a tmpfs, as NVIDIA's
`mps-control-daemon mount-shm` makes it (half the node's memory, nosuid,nodev,noexec), where we
may mount one and the mount reaches the clients.

A tmpfs mounted on a mount that does not propagate (a container's hostPath without
`mountPropagation: Bidirectional`) would be seen by the daemon alone while every client mounts
the host's directory underneath, so there, as where mounting is not permitted (no
CAP_SYS_ADMIN), the plain directory serves instead, with a warning saying why.
"""

from __future__ import annotations

import ctypes
import logging
import os
from pathlib import Path

from deviceplugin.model.hostpaths import under_system_dir
from deviceplugin.model.log import log_event

logger = logging.getLogger(__name__)

MS_NOSUID, MS_NODEV, MS_NOEXEC = 2, 4, 8
MNT_DETACH = 2  # lazily: a client still mapping it keeps its memory until it lets go
FALLBACK_SIZE = "65536k"  # the reference's, when /proc/meminfo says nothing


def prepare_shm(path: str) -> None:
    """Make `path` a directory, and a tmpfs where that reaches the clients (see the module)."""
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    if os.path.ismount(directory):
        return  # ours from an earlier start, or the operator's
    why = _why_not_tmpfs(directory)
    if why is None:
        why = _mount_tmpfs(directory)
    if why is None:
        log_event(logger, "mps.shm_mounted", path=path, size=_size())
    else:
        log_event(logger, "mps.shm_not_tmpfs", logging.WARNING, path=path, reason=why)


def unsafe_directory(base: str, path: str) -> str | None:
    """Why `path`, below `base`, must not be made or mounted on: a component below `base` that
    is a symbolic link (`<root>/shm` linked to /dev/shm would be every client's /dev/shm, and a
    tmpfs mounted on it the host's), or a real path under /dev, /proc or /sys (`base` itself a
    link there). None when it may be."""
    step = base
    for name in Path(path).relative_to(base).parts:
        step = os.path.join(step, name)
        if os.path.islink(step):
            return f"{step} is a symbolic link (to {os.readlink(step)}): refusing to follow it"
        if not os.path.lexists(step):
            break  # made by us from here on
    real = os.path.realpath(path)
    if under_system_dir(real):
        return f"{path} resolves to {real}, under /dev, /proc or /sys: refusing it"
    return None


def release_shm(path: str) -> None:
    """Unmount the tmpfs on `path`, whose directory is about to be removed: left mounted, it
    would outlive the directory's removal (rmdir fails on a mount point) and hold its memory."""
    if not os.path.ismount(path):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.umount2(path.encode(), MNT_DETACH) != 0:
        error = os.strerror(ctypes.get_errno())
        log_event(logger, "mps.shm_unmount_failed", logging.WARNING, path=path, error=error)


def _why_not_tmpfs(directory: Path) -> str | None:
    """Why a tmpfs on `directory` would not reach the clients; None when it would."""
    if os.geteuid() != 0:
        return "not running as root"
    mount = _mount_of(directory)
    if mount is not None and not any(tag.startswith("shared:") for tag in mount):
        return (
            "the mount holding it does not propagate (in a pod: mountPropagation Bidirectional, "
            "which needs a privileged container), so clients would not see a tmpfs there"
        )
    return None


def _mount_of(directory: Path) -> list[str] | None:
    """The optional fields (propagation tags) of the mount holding `directory`, or None when
    /proc/self/mountinfo cannot be read."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    target, best, tags = str(directory.resolve()), "", None
    for line in lines:
        fields = line.split(" - ")[0].split()
        point = fields[4].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, tags = point, fields[6:]
    return tags


def _mount_tmpfs(directory: Path) -> str | None:
    """Mount the tmpfs; the error when the kernel refuses."""
    libc = ctypes.CDLL(None, use_errno=True)
    options = f"size={_size()}".encode()
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    if libc.mount(b"tmpfs", str(directory).encode(), b"tmpfs", flags, options) != 0:
        return f"mount tmpfs: {os.strerror(ctypes.get_errno())}"
    return None


def _size() -> str:
    """Half the node's memory, as the reference sizes it."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) // 2}k"
    except (OSError, ValueError, IndexError):
        pass
    return FALLBACK_SIZE
