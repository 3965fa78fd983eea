"""`<mpsRoot>/shm` is a tmpfs where it can be one that clients see, as NVIDIA's `mount-shm` makes
it, and a plain directory with a warning saying why everywhere else. Each case runs in a private
mount namespace of its own (`unshare -m`), so no mount outlives it or reaches the host."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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
