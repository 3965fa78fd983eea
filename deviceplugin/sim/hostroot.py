"""The files a simulated node's driver would put on the host, laid out under one directory.

Stands for the whole host: `dev/` (GPU, control and MIG capability nodes), `proc/devices` and
`proc/driver/nvidia-caps/mig-minors` and `proc/driver/nvidia/capabilities/gpu<N>/mig/...` (what
the kernel module publishes), each GPU's
`sys/bus/pci/devices/<bus id>/numa_node`, and placeholder
user-space files of the node's driver version (`usr/lib/x86_64-linux-gnu/libcuda.so.<ver>` with
its soname links, `usr/bin/nvidia-smi`, GSP firmware). Run as root, the device nodes are real
character devices with the driver's majors and minors (a runtime can pass them into a
container; opening one fails without the driver); otherwise they are empty plain files. The
tree is marked as simulated, last (`model.hostpaths.SIM_ROOT_MARKER`): a driver root is taken
for a simulated host by that mark only, never by the files it holds.

`deviceplugin sim-root NODE DIR` writes such a tree, and with `install_library` the simulated
`libnvidia-ml.so.<ver>` (`sim/native/`) in place of the placeholder, the node rendered for it
beside it and an empty events file, so any NVML consumer given DIR as its driver root runs on
the node, and with `install_mps_control` and `install_nvidia_smi` the simulated MPS control
program and `nvidia-smi` (which sets compute modes) in `usr/bin/`;
`serve --simulate` lays out a tree (without the library) in a scratch dir, in /dev/shm where
there is one, unless `--nvidia-driver-root` names one.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from deviceplugin.model.hostpaths import (
    MIG_MINORS,
    SIM_NODE_FILE,
    SIM_ROOT,
    SIM_ROOT_MARKER,
    capability_node,
)
from deviceplugin.node.discovery import sysfs_bus_id
from deviceplugin.sim.node import Node

NVIDIA_MAJOR = 195
UVM_MAJOR = 510  # dynamic on a real host; /proc/devices says which
CAPS_MAJOR = 234  # dynamic on a real host; /proc/devices says which
CONTROL_NODES = {  # path -> (major, minor)
    "/dev/nvidiactl": (NVIDIA_MAJOR, 255),
    "/dev/nvidia-modeset": (NVIDIA_MAJOR, 254),
    "/dev/nvidia-uvm": (UVM_MAJOR, 0),
    "/dev/nvidia-uvm-tools": (UVM_MAJOR, 1),
}
# The driver's table covers 32 GPUs x 15 GPU instances x 8 compute instances.
TABLE_GPUS, TABLE_GPU_INSTANCES, TABLE_COMPUTE_INSTANCES = 32, 15, 8
LIBRARY_DIR = "usr/lib/x86_64-linux-gnu"
LIBRARIES = ("libcuda.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so", "libnvidia-nvvm.so")
BINARIES = ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced")
FIRMWARE = ("gsp_ga10x.bin", "gsp_tu10x.bin")
# Where the simulated library looks, relative to DIR (native/node.c says the same).
LIBRARY_NODE_FILE = f"{LIBRARY_DIR}/{SIM_NODE_FILE}"
EVENTS_FILE = "etc/deviceplugin-sim/events.jsonl"
# The MIG layout the library's processes share once one of them changes it (native/state.c).
MIG_STATE_FILE = "etc/deviceplugin-sim/mig-state.json"
# Each device's compute mode, shared the same way (native/compute.c); absent: all DEFAULT.
COMPUTE_MODE_FILE = "etc/deviceplugin-sim/compute-mode.json"
# The simulated MPS control program (native/mpscontrol.c), where the driver installs NVIDIA's.
MPS_CONTROL = "usr/bin/nvidia-cuda-mps-control"
# The simulated nvidia-smi (native/nvidiasmi.c), over the placeholder, by `install_nvidia_smi`.
NVIDIA_SMI = "usr/bin/nvidia-smi"
CAPABILITIES_DIR = "proc/driver/nvidia/capabilities"
# Each GPU's PCI function as the kernel shows it; NUMA affinity is read from here.
SYSFS_PCI_DEVICES = "sys/bus/pci/devices"


def gpu_instance_minor(gpu: int, gpu_instance: int) -> int:
    """The driver's minor for `gpu<gpu>/gi<gpu_instance>/access`."""
    return 3 + 135 * gpu + 9 * gpu_instance


def mig_device_minors(gpu: int, gpu_instance: int, compute_instance: int) -> tuple[int, int]:
    """The driver's minors for a MIG device's `gpu<gpu>/gi<G>/access` and `.../ci<C>/access`."""
    access = gpu_instance_minor(gpu, gpu_instance)
    return access, access + 1 + compute_instance


def mig_minors_table(gpus: Iterable[int] = range(TABLE_GPUS)) -> dict[str, int]:
    """The mig-minors table the kernel module writes at load, in its order: the whole of it, or
    the rows of `gpus` only (those the table covers)."""
    table = dict(_CONTROL_MINORS)
    for gpu in gpus:
        if 0 <= gpu < TABLE_GPUS:
            table.update(_gpu_minors(gpu))
    return table


_CONTROL_MINORS = {"config": 1, "monitor": 2}


def _gpu_minors(gpu: int) -> dict[str, int]:
    rows = {}
    for gi in range(TABLE_GPU_INSTANCES):
        access = gpu_instance_minor(gpu, gi)
        rows[f"gpu{gpu}/gi{gi}/access"] = access
        for ci in range(TABLE_COMPUTE_INSTANCES):
            rows[f"gpu{gpu}/gi{gi}/ci{ci}/access"] = access + 1 + ci
    return rows


def capability_files(node: Node) -> dict[str, int]:
    """The capability files the kernel module publishes under
    /proc/driver/nvidia/capabilities for the GPU and compute instances that exist now
    (`gpu<minor>/mig/gi<id>/access`, `.../ci<id>/access`), with their minors (the driver's
    rule, which mig-minors lists for the first 32 GPUs)."""
    files = {}
    for gpu in node.gpus:
        for mig in gpu.mig_devices:
            gi, ci = mig.gpu_instance_id, mig.compute_instance_id
            access, compute = mig_device_minors(gpu.minor, gi, ci)
            files[f"gpu{gpu.minor}/mig/gi{gi}/access"] = access
            files[f"gpu{gpu.minor}/mig/gi{gi}/ci{ci}/access"] = compute
    return files


def capability_text(minor: int) -> str:
    """One capability file: the /dev/nvidia-caps node's minor, its mode (0444) and whether the
    driver may change it."""
    return f"DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n"


def proc_devices_text() -> str:
    """/proc/devices with the driver's character majors."""
    return (
        "Character devices:\n  1 mem\n  5 /dev/tty\n"
        f"{NVIDIA_MAJOR} nvidia-frontend\n{CAPS_MAJOR} nvidia-caps\n{UVM_MAJOR} nvidia-uvm\n"
        "\nBlock devices:\n  8 sd\n"
    )


def device_nodes(node: Node, every_instance: bool = True) -> dict[str, tuple[int, int]]:
    """The device nodes of the simulated host: path -> (major, minor). With `every_instance`,
    the capability nodes of every GPU instance and compute instance each GPU's minor can have,
    so a MIG re-cut finds its nodes too (over a thousand on eight GPUs); otherwise only those
    of the MIG devices the node has now."""
    nodes = dict(CONTROL_NODES)
    for gpu in node.gpus:
        nodes[f"/dev/nvidia{gpu.minor}"] = (NVIDIA_MAJOR, gpu.minor)
        if every_instance:
            wanted = list(_gpu_minors(gpu.minor).values()) if gpu.minor < TABLE_GPUS else []
        else:
            wanted = []
            for mig in gpu.mig_devices:
                wanted += mig_device_minors(gpu.minor, mig.gpu_instance_id, mig.compute_instance_id)
        nodes.update({capability_node(minor): (CAPS_MAJOR, minor) for minor in wanted})
    for minor in _CONTROL_MINORS.values():
        nodes[capability_node(minor)] = (CAPS_MAJOR, minor)
    return nodes


def lay_out_proc(proc: Path, gpus: Iterable[int] = range(TABLE_GPUS)) -> None:
    """The kernel module's files under `proc`: the mig-minors table (the whole of it, or the
    rows of `gpus`) and the character majors of `devices`."""
    table = "".join(f"{key} {minor}\n" for key, minor in mig_minors_table(gpus).items())
    _write(proc / MIG_MINORS, table.encode())
    _write(proc / "devices", proc_devices_text().encode())


def lay_out(node: Node, root: Path, every_instance: bool = True) -> bool:
    """Write the host tree of `node` under `root` (created if missing; files already there are
    replaced). True when the device nodes are real character devices. `every_instance` as in
    `device_nodes`: creating a node costs about half a millisecond here, so the temporary tree
    of `serve --simulate` makes only the ones in use, and lists only its GPUs in mig-minors."""
    version = node.driver_version
    gpus = range(TABLE_GPUS) if every_instance else [gpu.minor for gpu in node.gpus]
    lay_out_proc(root / "proc", gpus)
    real = os.geteuid() == 0
    for path, (major, minor) in device_nodes(node, every_instance).items():
        real = _device(root / path.lstrip("/"), major, minor, real)
    for library in LIBRARIES:
        target = root / LIBRARY_DIR / f"{library}.{version}"
        _write(target, f"placeholder: {library}.{version} of a simulated node\n".encode())
        _link(target.parent / f"{library}.1", target.name)
        _link(target.parent / library, f"{library}.1")
    for binary in BINARIES:
        _write(
            root / "usr/bin" / binary, f"#!/bin/sh\necho simulated {binary} {version}\n".encode()
        )
        (root / "usr/bin" / binary).chmod(0o755)
    for firmware in FIRMWARE:
        _write(root / "lib/firmware/nvidia" / version / firmware, b"placeholder firmware\n")
    _write(root / SIM_ROOT_MARKER, sim_root_marker(node).encode())
    return real


def sim_root_marker(node: Node) -> str:
    """The marker's text: what it is, what wrote it, and the node it stands for."""
    marker = {
        "kind": SIM_ROOT,
        "writer": "deviceplugin sim-root",
        "driverVersion": node.driver_version,
        "gpus": len(node.gpus),
    }
    return json.dumps(marker, indent=2) + "\n"


def install_library(node: Node, root: Path, library: Path) -> None:
    """Put the simulated NVML library (`library`, a build of `sim/native/`) under `root` as
    `libnvidia-ml.so.<ver>` with its `.so.1` and `.so` links, the node rendered for it beside
    it, the events file it reads (created empty when missing), each GPU's sysfs `numa_node`
    and the capability files of its MIG devices. A copy, not a link: the
    dynamic loader treats two roots' copies as two libraries, each finding its own node."""
    import shutil  # `sim-root` installs the library; `serve --simulate` does not

    from deviceplugin.sim.nodejson import render

    target = root / LIBRARY_DIR / f"libnvidia-ml.so.{node.driver_version}"
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = target.with_name(f".{target.name}.new")
    shutil.copyfile(library, scratch)
    scratch.chmod(0o755)
    os.replace(scratch, target)
    _link(target.parent / "libnvidia-ml.so.1", target.name)
    _link(target.parent / "libnvidia-ml.so", "libnvidia-ml.so.1")
    _write(root / LIBRARY_NODE_FILE, render(node).encode())
    # The node's own MIG layout and compute modes again: changes made since are forgotten.
    for state in (MIG_STATE_FILE, COMPUTE_MODE_FILE):
        with contextlib.suppress(FileNotFoundError):
            (root / state).unlink()
    shutil.rmtree(root / CAPABILITIES_DIR, ignore_errors=True)
    # What NVIDIA's consumers read beside NVML (ours too, from a driver root): only a root laid
    # out for them needs it, not the temporary tree `serve --simulate` starts with.
    for key, minor in capability_files(node).items():
        _write(root / CAPABILITIES_DIR / key, capability_text(minor).encode())
    for gpu in node.gpus:
        numa = -1 if gpu.numa_node is None else gpu.numa_node  # the kernel's "no affinity"
        _write(
            root / SYSFS_PCI_DEVICES / sysfs_bus_id(gpu.pci_bus_id) / "numa_node", b"%d\n" % numa
        )
    events = root / EVENTS_FILE
    if not events.exists():
        _write(events, b"")
        events.chmod(0o666)


def install_mps_control(root: Path, program: Path) -> None:
    """Put the simulated `nvidia-cuda-mps-control` (`program`, a build of
    `sim/native/mpscontrol.c`) where the driver puts NVIDIA's: consumers run it from the driver
    root as they would the real one."""
    install_program(root, MPS_CONTROL, program)


def install_nvidia_smi(root: Path, program: Path) -> None:
    """Put the simulated `nvidia-smi` (`program`, a build of `sim/native/nvidiasmi.c`) in place of
    the placeholder: NVIDIA's MPS daemon sets compute modes with it."""
    install_program(root, NVIDIA_SMI, program)


def install_program(root: Path, relative: str, program: Path) -> None:
    """`program` at `root/relative`, executable: a copy renamed into place, as the library is."""
    import shutil

    target = root / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = target.with_name(f".{target.name}.new")
    shutil.copyfile(program, scratch)
    scratch.chmod(0o755)
    os.replace(scratch, target)


def _write(path: Path, content: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    path.chmod(0o644)


def _link(path: Path, target: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    path.symlink_to(target)


def _device(path: Path, major: int, minor: int, real: bool) -> bool:
    """A character device (as root) or a plain file; False once mknod is refused (root without
    CAP_MKNOD), so the rest of the tree is made of plain files too."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    if real:
        try:
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
            return True
        except PermissionError:
            pass
    path.touch(0o644)
    return False
