"""A real container runtime for the end-to-end tests: podman, with each workload container
seeing only the CDI directory a test gives it, and the device nodes it got read back.

Podman 4.3 reads CDI specs only from /etc/cdi and /var/run/cdi, so a workload runs in its own
mount namespace with the test's directory bound over /var/run/cdi and an empty one over
/etc/cdi: the host's own specs never leak in, and tests can run side by side.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

import pytest

from deviceplugin.sim.node import Node

WORKLOAD_IMAGE = os.environ.get("E2E_WORKLOAD_IMAGE", "localhost/deviceplugin-e2e-busybox:latest")
CDI_KIND = "k8s.device-plugin.nvidia.com/gpu"
# Every NVIDIA character device the container has, as `path major minor` (hex).
LIST_NODES = (
    "for f in /dev/nvidia* /dev/nvidia-caps/*; do"
    ' [ -c "$f" ] && stat -c \'%n %t %T\' "$f"; done; true'
)

needs_podman = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("podman") is None,
    reason="needs root and podman: run `make e2e`",
)


def podman(*args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", *args], capture_output=True, text=True, check=check, timeout=timeout
    )


def device_nodes(listing: str) -> dict[str, tuple[int, int]]:
    """`path major minor` lines (hex numbers) -> {path: (major, minor)}."""
    found = {}
    for line in listing.splitlines():
        parts = line.split()
        if len(parts) == 3:
            found[parts[0]] = (int(parts[1], 16), int(parts[2], 16))
    return found


CONTROL_NODES = (
    "/dev/nvidiactl",
    "/dev/nvidia-modeset",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
)
NVIDIA_MAJOR, CAPS_MAJOR = 195, 234


def expected_nodes(driver_root: Path, node: Node, device_id: str) -> dict[str, tuple[int, int]]:
    """What a container given `device_id` alone must see, from the node file and the driver's
    mig-minors formula (3 + 135·gpu + 9·gi, then + 1 + ci), never from the plugin's output."""
    uuid = device_id.split("::")[0]
    nodes = {path: host_node(driver_root / path.lstrip("/")) for path in CONTROL_NODES}
    for gpu in node.gpus:
        if gpu.uuid == uuid:
            nodes[f"/dev/nvidia{gpu.minor}"] = (NVIDIA_MAJOR, gpu.minor)
            return nodes
        for mig in gpu.mig_devices:
            if mig.uuid == uuid:
                gi = 3 + 135 * gpu.minor + 9 * mig.gpu_instance_id
                ci = gi + 1 + mig.compute_instance_id
                nodes[f"/dev/nvidia{gpu.minor}"] = (NVIDIA_MAJOR, gpu.minor)
                nodes[f"/dev/nvidia-caps/nvidia-cap{gi}"] = (CAPS_MAJOR, gi)
                nodes[f"/dev/nvidia-caps/nvidia-cap{ci}"] = (CAPS_MAJOR, ci)
                return nodes
    raise AssertionError(f"{device_id} is not a device of the simulated node")


def host_node(path: str | Path) -> tuple[int, int]:
    """The major:minor of a character device on this host."""
    info = os.stat(path)
    return os.major(info.st_rdev), os.minor(info.st_rdev)


def workload(cdi_dir: Path, args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    """Run a workload container with `args` (`--device ...`, `-e ...`) that lists its NVIDIA
    device nodes, seeing only `cdi_dir` as the runtime's CDI directories."""
    empty = tempfile.mkdtemp(prefix="dp-e2e-etc-cdi-")
    try:
        command = ["podman", "run", "--rm", "--network", "none", *args]
        run = shlex.join([*command, WORKLOAD_IMAGE, "sh", "-c", LIST_NODES])
        hide_etc_cdi = f"if [ -d /etc/cdi ]; then mount --bind {shlex.quote(empty)} /etc/cdi; fi"
        script = (
            f"mkdir -p /var/run/cdi && mount --bind {shlex.quote(str(cdi_dir))} /var/run/cdi"
            f" && {hide_etc_cdi} && {run}"
        )
        return subprocess.run(
            ["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=60
        )
    finally:
        os.rmdir(empty)


def cdi_args(names: Sequence[str]) -> list[str]:
    """`--device <name>` for each CDI name: what a CDI-enabled runtime does with them."""
    return [arg for name in names for arg in ("--device", name)]
