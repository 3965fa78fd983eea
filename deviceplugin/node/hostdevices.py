"""The host facts an Allocate response depends on, read from the file system and cached.

Two facts come from the host: which NVIDIA control nodes exist (`/dev/nvidiactl`,
`/dev/nvidia-uvm`, ...) and the MIG capability minors the driver publishes in
`/proc/driver/nvidia-caps/mig-minors`. Reading them here, under roots a test can point at a
temp dir, keeps allocation.py pure.

The mig-minors table is read from the kernel's procfs (default `/proc`), not from under the
driver root: the file belongs to the loaded kernel module, and the reference plugin reads it at
that absolute path too, so it is right for host-installed and containerised drivers alike.
"""

from __future__ import annotations

import os

from deviceplugin.model.hostpaths import MIG_MINORS, host_path, parse_mig_minors


class HostDevices:
    """Cached answers to "does this device node exist?" and "which minor backs this MIG
    capability?". `refresh()` forgets everything; call it on rediscovery (driver reload,
    MIG reconfiguration)."""

    def __init__(self, proc_root: str = "/proc") -> None:
        self.proc_root = proc_root
        self._present: set[str] = set()
        self._mig_minors: dict[str, int] | None = None

    @property
    def mig_minors_path(self) -> str:
        return host_path(self.proc_root, MIG_MINORS)

    def exists(self, path: str) -> bool:
        """Whether the host path exists. Only hits are cached: `/dev/nvidia-uvm` and
        `/dev/nvidia-modeset` are created on demand after boot, and a cached miss would hide
        them from every later container."""
        if path in self._present:
            return True
        if os.path.exists(path):
            self._present.add(path)
            return True
        return False

    def mig_minor(self, key: str) -> int | None:
        """The minor for a mig-minors key such as `gpu3/gi1/ci0/access`, or None. The table is
        parsed once: the driver writes every possible entry when it loads. A missing file reads
        as an empty table, so the caller reports the exact entry it needed."""
        if self._mig_minors is None:
            try:
                with open(self.mig_minors_path, encoding="utf-8") as file:
                    self._mig_minors = parse_mig_minors(file.read())
            except FileNotFoundError:
                self._mig_minors = {}
        return self._mig_minors.get(key)

    def refresh(self) -> None:
        """Forget cached answers, so the next allocation reads the host again."""
        self._present.clear()
        self._mig_minors = None
