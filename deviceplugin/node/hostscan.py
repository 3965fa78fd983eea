"""Reads what the CDI spec needs from the host into a `HostScan`: control nodes, majors, the
mig-minors table and the driver's files.

Three roots, so a test or a simulated node can point each at a temp dir: the dev root (device
nodes), the driver root (libraries, binaries, firmware, found by the driver version NVML
reported) and the proc root (`devices`, `driver/nvidia-caps/mig-minors`, the kernel module's
files). Everything is read here once per call; the pure builder in `model/cdi.py` does the rest.
A driver root that `deviceplugin sim-root` marked also gives the files its simulated library
reads besides itself, so that the library works in a container as it does on the host.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from deviceplugin.model.allocation import CONTROL_NODES
from deviceplugin.model.cdi import HostScan, NodeFile
from deviceplugin.model.hostpaths import (
    MIG_MINORS,
    SIM_NODE_FILE,
    SIM_STATE_DIR,
    host_path,
    parse_mig_minors,
)
from deviceplugin.node.simmarker import is_sim_root

# Where distributions put the driver's user-space files, as a container sees them.
LIBRARY_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/lib/x86_64-linux-gnu",
    "/lib64",
)
# The compute and utility libraries, each installed as `<name>.<driver version>`.
LIBRARIES = (
    "libcuda.so",
    "libcudadebugger.so",
    "libnvidia-ml.so",
    "libnvidia-ptxjitcompiler.so",
    "libnvidia-nvvm.so",
    "libnvidia-opencl.so",
    "libnvidia-gpucomp.so",
    "libnvidia-allocator.so",
    "libnvidia-cfg.so",
    "libnvidia-pkcs11.so",
)
BINARY_DIRS = ("/usr/bin", "/usr/sbin", "/bin", "/sbin")
BINARIES = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
)
FIRMWARE_DIRS = ("/lib/firmware/nvidia", "/usr/lib/firmware/nvidia")
PROC_DEVICES = "devices"  # under the proc root


def scan_host(driver_version: str, driver_root: str, dev_root: str, proc_root: str) -> HostScan:
    """Everything the spec needs from this host, read now."""
    libraries = _libraries(driver_root, driver_version)
    return HostScan(
        driver_version=driver_version,
        control_nodes=tuple(
            node for path in CONTROL_NODES if (node := _node_file(dev_root, path)) is not None
        ),
        majors=read_majors(host_path(proc_root, PROC_DEVICES)),
        mig_minors=_read_mig_minors(host_path(proc_root, MIG_MINORS)),
        libraries=libraries,
        binaries=_found(driver_root, (f"{d}/{name}" for name in BINARIES for d in BINARY_DIRS)),
        firmware=_firmware(driver_root, driver_version),
        simulation=_simulation(driver_root, libraries),
    )


def read_majors(path: str) -> dict[str, int]:
    """The `Character devices:` section of /proc/devices: name -> major. A missing file reads
    as empty (the caller falls back to the driver's fixed major or to the host node)."""
    majors: dict[str, int] = {}
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return majors
    in_char = False
    for line in text.splitlines():
        if line.strip().endswith("devices:"):
            in_char = line.strip() == "Character devices:"
            continue
        fields = line.split()
        if in_char and len(fields) == 2 and fields[0].isdigit():
            majors.setdefault(fields[1], int(fields[0]))
    return majors


def _read_mig_minors(path: str) -> dict[str, int]:
    try:
        return parse_mig_minors(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}


def _node_file(root: str, path: str) -> NodeFile | None:
    try:
        info = os.stat(host_path(root, path))
    except FileNotFoundError:
        return None
    if stat.S_ISCHR(info.st_mode):
        return NodeFile(path, os.major(info.st_rdev), os.minor(info.st_rdev))
    return NodeFile(path)


def _found(root: str, paths: Iterable[str]) -> tuple[str, ...]:
    """The paths (as a container sees them) that exist under `root`, first of each name."""
    found: dict[str, str] = {}
    for path in paths:
        name = os.path.basename(path)
        if name not in found and os.path.isfile(host_path(root, path)):
            found[name] = path
    return tuple(found.values())


def _libraries(root: str, version: str) -> tuple[str, ...]:
    """Each library `<name>.<version>` in the first directory that has it, followed by the
    links in that directory that resolve to it (`libcuda.so.1`), so programs find it by its
    soname without an ldcache update in the container."""
    if not version:
        return ()
    found: list[str] = []
    for library in _found(
        root, (f"{d}/{lib}.{version}" for lib in LIBRARIES for d in LIBRARY_DIRS)
    ):
        found.append(library)
        directory = os.path.dirname(library)
        target = os.path.realpath(host_path(root, library))
        prefix = os.path.basename(library)[: -len(version) - 1]
        try:
            names = sorted(os.listdir(host_path(root, directory)))
        except OSError:
            continue
        for name in names:
            link = host_path(root, f"{directory}/{name}")
            if (
                name.startswith(prefix)
                and os.path.islink(link)
                and os.path.realpath(link) == target
            ):
                found.append(f"{directory}/{name}")
    return tuple(found)


def _firmware(root: str, version: str) -> tuple[str, ...]:
    """The GSP firmware of this driver version (`/lib/firmware/nvidia/<ver>/gsp*.bin`)."""
    if not version:
        return ()
    for directory in FIRMWARE_DIRS:
        where = host_path(root, f"{directory}/{version}")
        try:
            names = sorted(
                n for n in os.listdir(where) if n.startswith("gsp") and n.endswith(".bin")
            )
        except OSError:
            continue
        if names:
            return tuple(f"{directory}/{version}/{name}" for name in names)
    return ()


def _simulation(root: str, libraries: tuple[str, ...]) -> tuple[str, ...]:
    """On a marked simulated root, what its libnvidia-ml reads (sim/native/node.c): the node
    rendered beside the library, and the state directory its processes share (events, MIG
    layout, memory limits; mounted whole, as its files are replaced by rename)."""
    if not is_sim_root(root):
        return ()
    found = []
    nvml = [lib for lib in libraries if os.path.basename(lib).startswith("libnvidia-ml.so.")]
    if nvml:
        node = f"{os.path.dirname(nvml[0])}/{SIM_NODE_FILE}"
        if os.path.isfile(host_path(root, node)):
            found.append(node)
    if os.path.isdir(host_path(root, SIM_STATE_DIR)):
        found.append(SIM_STATE_DIR)
    return tuple(found)
