"""Where the driver's files are, as rules: host paths under a root, and the mig-minors table.

Pure functions shared by Allocate's device specs, the CDI spec and the host readers in
`deviceplugin.node`, so every one of them names the same node for the same device.
"""

from __future__ import annotations

import posixpath

MIG_MINORS = "driver/nvidia-caps/mig-minors"  # under the proc root
# Under a driver root `deviceplugin sim-root` laid out: the marker saying the tree stands for a
# simulated host, whose `proc/` is read in place of the real /proc. Its `kind` must be SIM_ROOT.
SIM_ROOT_MARKER = "etc/deviceplugin-sim/sim-root.json"
SIM_ROOT = "deviceplugin-sim-root"
# The simulated libnvidia-ml's own files: the node it renders, beside the library, and the state
# every process loading it shares (events, MIG layout, memory limits), three levels above it.
SIM_NODE_FILE = "deviceplugin-sim-node.json"
SIM_STATE_DIR = "/etc/deviceplugin-sim"
MAX_SOCKET_PATH = 107  # bytes: sockaddr_un.sun_path holds 108, with the terminating NUL
MPS_CONTROL_SOCKET = "control"  # in an MPS daemon's pipe directory, as NVIDIA's names it
SYSTEM_DIRS = ("/dev", "/proc", "/sys")  # never an MPS directory, nor under one


def under_system_dir(path: str) -> bool:
    """Whether `path` (absolute, normalised) is /dev, /proc or /sys or lies under one."""
    return any(path == s or path.startswith(s + "/") for s in SYSTEM_DIRS)


def host_path(root: str, path: str) -> str:
    """`path` (absolute, as a container sees it) under `root` on the host, normalised."""
    return posixpath.normpath(posixpath.join(root, path.lstrip("/")))


def mps_paths(mps_root: str, resource: str) -> tuple[str, str, str]:
    """An MPS resource's pipe, log and shm directories under `mps_root` (the reference's
    layout: `<root>/<resource>/pipe`, `<root>/<resource>/log`, one `<root>/shm` for all)."""
    return (
        f"{mps_root.rstrip('/')}/{resource}/pipe",
        f"{mps_root.rstrip('/')}/{resource}/log",
        f"{mps_root.rstrip('/')}/shm",
    )


def socket_path_problem(socket: str) -> str | None:
    """Why `socket` cannot be a unix socket path, or None (its length in bytes as the kernel
    counts them: the file system's UTF-8, undecodable bytes kept)."""
    size = len(str(socket).encode("utf-8", "surrogateescape"))
    if size > MAX_SOCKET_PATH:
        return f"{socket} is {size} bytes long; a unix socket path holds at most {MAX_SOCKET_PATH}"
    return None


def parse_mig_minors(text: str) -> dict[str, int]:
    """`gpu3/gi1/access 30` lines -> {"gpu3/gi1/access": 30}; lines of another shape are
    skipped, so a driver that adds new kinds of entry does not break allocation."""
    table: dict[str, int] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[1].isdigit():
            table[fields[0]] = int(fields[1])
    return table


def gpu_instance_key(gpu_minor: int, gpu_instance: int) -> str:
    """The mig-minors key of a GPU instance's access capability. The table names the parent
    by its minor number (`gpu<minor>/...`), which can differ from NVML's index."""
    return f"gpu{gpu_minor}/gi{gpu_instance}/access"


def compute_instance_key(gpu_minor: int, gpu_instance: int, compute_instance: int) -> str:
    """The mig-minors key of a compute instance's access capability."""
    return f"gpu{gpu_minor}/gi{gpu_instance}/ci{compute_instance}/access"


def capability_node(minor: int) -> str:
    """The device node of a MIG capability minor."""
    return f"/dev/nvidia-caps/nvidia-cap{minor}"
