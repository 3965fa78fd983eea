"""`<mpsRoot>/shm` is a tmpfs where it can be one that clients see, as NVIDIA's `mount-shm` makes
it, and a plain directory with a warning saying why everywhere else. Each case runs in a private
mount namespace of its own (`unshare -m`), so no mount outlives it or reaches the host."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from deviceplugin.model.hostpaths import mps_paths
from deviceplugin.model.mps import DaemonSpec
from deviceplugin.node.mpsdaemon import MpsControl, MpsError

AS_ROOT = os.geteuid() == 0 and shutil.which("unshare") is not None
root_only = pytest.mark.skipif(not AS_ROOT, reason="mount namespaces need root and unshare")

# Prepares the shm twice (a restart finds its own tmpfs), then prints how it is mounted.
SCRIPT = """
import logging, os, sys
from pathlib import Path
from deviceplugin.node.mpsshm import prepare_shm
form = "%(levelname)s %(message)s %(dp_fields)s"
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format=form)
path = sys.argv[1]
prepare_shm(path)
prepare_shm(path)
for line in Path("/proc/self/mountinfo").read_text().splitlines():
    head, tail = line.split(" - ")
    if head.split()[4] == path:
        size = os.statvfs(path)
        print(tail.split()[0], head.split()[5], size.f_blocks * size.f_frsize // 1024)
"""


# In the namespace, the test's directory becomes a shared mount of its own: where a tmpfs
# propagates, as under a pod's `mountPropagation: Bidirectional`.
PRIVATE = ("unshare", "-m", "--propagation", "private")
SHARED = (
    *PRIVATE,
    "sh",
    "-c",
    'mount --bind "$1" "$1" && mount --make-shared "$1" && shift && exec "$@"',
    "sh",
)


def prepare(shm: Path, *prefix: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*prefix, sys.executable, "-c", SCRIPT, str(shm)],
        capture_output=True,
        text=True,
        check=True,
    )


@root_only
def test_a_tmpfs_the_size_of_half_the_memory_where_the_mount_propagates(tmp_path: Path) -> None:
    done = prepare(tmp_path / "shm", *SHARED, str(tmp_path))
    (mount,) = done.stdout.splitlines()  # once, though prepared twice
    fstype, options, size_kib = mount.split()
    assert fstype == "tmpfs"
    assert {"nosuid", "nodev", "noexec"} <= set(options.split(","))
    total_kib = next(
        int(line.split()[1])
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal:")
    )
    assert abs(int(size_kib) - total_kib // 2) < 4  # whole pages
    assert "mps.shm_mounted" in done.stderr
    assert not os.path.ismount(tmp_path / "shm"), "the namespace's mount stays in it"


@root_only
def test_a_mount_that_does_not_propagate_keeps_the_directory(tmp_path: Path) -> None:
    done = prepare(tmp_path / "shm", *PRIVATE)
    assert done.stdout == ""
    assert "WARNING mps.shm_not_tmpfs" in done.stderr
    assert "does not propagate" in done.stderr
    assert (tmp_path / "shm").is_dir()


@root_only
def test_without_the_capability_to_mount_the_directory_serves_with_a_warning(
    tmp_path: Path,
) -> None:
    no_mounts = ("setpriv", "--bounding-set=-sys_admin", "--inh-caps=-sys_admin")
    done = prepare(tmp_path / "shm", *SHARED, str(tmp_path), *no_mounts)
    assert done.stdout == ""
    assert "WARNING mps.shm_not_tmpfs" in done.stderr
    assert "mount tmpfs: Operation not permitted" in done.stderr
    assert (tmp_path / "shm").is_dir()


@pytest.mark.skipif(os.geteuid() == 0, reason="as root the cases above run")
def test_not_root_keeps_the_directory(tmp_path: Path) -> None:
    done = prepare(tmp_path / "shm")
    assert "not running as root" in done.stderr
    assert (tmp_path / "shm").is_dir()


RELEASE = """
import os, shutil, sys
from deviceplugin.node.mpsshm import prepare_shm, release_shm
path = sys.argv[1]
prepare_shm(path)
mounted = os.path.ismount(path)
release_shm(path)
release_shm(path)  # nothing mounted: nothing to do
shutil.rmtree(os.path.dirname(path))
print(mounted, os.path.ismount(path), os.path.exists(path))
"""


@root_only
def test_a_released_shm_is_unmounted_so_its_directory_can_go(tmp_path: Path) -> None:
    home = tmp_path / "home"
    done = subprocess.run(
        [*SHARED, str(tmp_path), sys.executable, "-c", RELEASE, str(home / "shm")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.split() == ["True", "False", "False"], done.stderr


RESOURCE = "nvidia.com/gpu"


def start_in(root: Path, setting: str = "flags.mpsRoot") -> str:
    """Why a daemon under `root` is refused before anything is made (the control program is
    never reached: there is none)."""
    pipe, log, shm = mps_paths(str(root), RESOURCE)
    spec = DaemonSpec(RESOURCE, pipe, log, shm, ("GPU-x",), 100, ())
    control = MpsControl(root / "no-control-program", setting)
    with pytest.raises(MpsError) as refused:
        asyncio.run(control.start(spec))
    return str(refused.value)


@pytest.mark.parametrize("target", ["host-shm", "/dev/shm"])
def test_an_shm_that_is_a_link_is_refused_naming_the_mps_root(tmp_path: Path, target: str) -> None:
    root, host_shm = tmp_path / "mps", tmp_path / "host-shm"
    root.mkdir()
    host_shm.mkdir()
    (root / "shm").symlink_to(host_shm if target == "host-shm" else Path(target))
    why = start_in(root)
    assert f"{RESOURCE}: flags.mpsRoot: {root / 'shm'} is a symbolic link" in why, why
    assert list(host_shm.iterdir()) == [] and not os.path.ismount(host_shm)
    assert not (root / "nvidia.com").exists(), "nothing made before the refusal"


def test_a_resource_directory_that_is_a_link_is_refused(tmp_path: Path) -> None:
    root, elsewhere = tmp_path / "mps", tmp_path / "elsewhere"
    (root / "nvidia.com").mkdir(parents=True)
    elsewhere.mkdir()
    (root / RESOURCE).symlink_to(elsewhere)
    why = start_in(root, "--kubelet-root")
    assert f"--kubelet-root: {root / RESOURCE} is a symbolic link" in why, why
    assert list(elsewhere.iterdir()) == []


def test_an_mps_root_that_resolves_under_dev_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "mps"
    root.symlink_to("/dev")
    why = start_in(root)
    assert "resolves to /dev/" in why and "under /dev, /proc or /sys" in why, why
