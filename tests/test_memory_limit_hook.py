"""The memory-limit hook (`node/native/memory_limit_hook.c`) run as a runtime runs a
createContainer hook: a process with the container's OCI state on stdin, reading its cgroup from
a /proc and cgroup tree under a temp dir (tests/hookview.py). Checked through the simulated
libnvidia-ml.so.1 it loads: the limit is set on the container's pod cgroup, once for all of the
pod's containers, a record names it, and a failure, a path that is not plainly the container's
cgroup or a namespace it cannot leave caps nothing and leaves no record."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml as n
import pytest
from test_sim_library import opened
from test_sim_library_memory_limits import GIB, LIMITS_FILE, WHOLE_A100, get_limits

from deviceplugin.sim.hostroot import LIBRARY_DIR
from deviceplugin.sim.libbuild import hook_program
from tests.hookview import OTHER_POD, POD, HookView, finish, run_hook, stalled_hook

CLAIM = "0b5a7c2e-1f3d-4e6a-9b8c-7d6e5f4a3b2c"
OTHER_CLAIM = "9e8d7c6b-5a49-4382-a716-f5e4d3c2b1a0"
SHARE = "4d3c2b1a-0f9e-4d8c-b7a6-5e4d3c2b1a0f"


@pytest.fixture
def root(tmp_path: Path, fresh_sim_root: Callable[[str, Path], Path]) -> Any:
    directory = fresh_sim_root("a100-80gb-x8-mixed", tmp_path / "root")
    (tmp_path / "records").mkdir()
    nvml = opened(directory)
    yield directory
    nvml.shutdown()


@pytest.fixture
def view(tmp_path: Path) -> HookView:
    return HookView(tmp_path / "node")


def args(root: Path, gpu: str, limit: str, claim: str = CLAIM) -> list[str]:
    library = root / LIBRARY_DIR / "libnvidia-ml.so.1"
    records = root.parent / "records"
    return ["memory-limit-hook", str(library), str(records), claim, SHARE, gpu, limit]


def hook(
    root: Path, view: HookView, gpu: str, limit: str, claim: str = CLAIM
) -> subprocess.CompletedProcess[str]:
    return run_hook(hook_program(), args(root, gpu, limit, claim), view)


def records(root: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((root.parent / "records").glob("*.json"))]


def whole() -> tuple[Any, str]:
    handle = n.nvmlDeviceGetHandleByIndex(WHOLE_A100)
    return handle, n.nvmlDeviceGetUUID(handle)


def uncapped(view: HookView, root: Path) -> None:
    """No limit on any cgroup (the simulated library's file of them), and no record."""
    limits = root / LIMITS_FILE
    assert not limits.exists() or json.loads(limits.read_text())["limits"] == []
    assert records(root) == []


def test_the_hook_caps_its_pod_cgroup_and_records_it(root: Path, view: HookView) -> None:
    gpu, uuid = whole()
    done = hook(root, view, uuid, str(20 * GIB))
    assert done.returncode == 0, done.stderr
    assert get_limits(gpu, view.pod()) == (20 * GIB, 20 * GIB, 0)
    assert records(root) == [
        {"claim": CLAIM, "share": SHARE, "gpu": uuid, "nameSpace": view.pod(), "limit": 20 * GIB}
    ]
    (record,) = (root.parent / "records").glob("*.json")
    assert record.name.startswith(f"{CLAIM}_{SHARE}_")


@pytest.mark.parametrize(
    ("gpu", "limit", "claim", "message"),
    [
        pytest.param("whole", "lots", CLAIM, "BYTES: want a positive whole number", id="bytes"),
        pytest.param("whole", "0", CLAIM, "BYTES: want a positive whole number", id="zero"),
        pytest.param("whole", str(GIB), "../x", "CLAIM_UID: want a UID", id="claim"),
        pytest.param("whole", str(81 * GIB), CLAIM, "Invalid Argument", id="above-total"),
        pytest.param("mig", str(GIB), CLAIM, "Not Supported", id="mig"),
        pytest.param("GPU-no-such", str(GIB), CLAIM, "nvmlDeviceGetHandleByUUID", id="unknown"),
    ],
)
def test_a_refused_limit_fails_the_hook_and_leaves_nothing(
    root: Path, view: HookView, gpu: str, limit: str, claim: str, message: str
) -> None:
    if gpu == "whole":
        gpu = whole()[1]
    elif gpu == "mig":
        gpu = n.nvmlDeviceGetUUID(
            n.nvmlDeviceGetMigDeviceHandleByIndex(n.nvmlDeviceGetHandleByIndex(0), 0)
        )
    done = hook(root, view, gpu, limit, claim)
    assert done.returncode == 1
    assert done.stderr.startswith("memory-limit-hook: ") and message in done.stderr, done.stderr
    uncapped(view, root)


def test_a_library_without_the_call_fails_the_hook(root: Path, view: HookView) -> None:
    given = args(root, "GPU-x", str(GIB))
    given[1] = "/lib/x86_64-linux-gnu/libc.so.6"
    done = run_hook(hook_program(), given, view)
    assert done.returncode == 1
    assert "lacks nvmlDeviceSetMemoryLimits_v1" in done.stderr, done.stderr
    assert records(root) == []


SYSTEMD_POD = POD.replace("-", "_")  # the systemd driver's slice names write the UID with _


def hook_in(root: Path, view: HookView, container: str) -> subprocess.CompletedProcess[str]:
    """The hook for a whole GPU's 1 GiB share, run from a container at cgroup `container`."""
    (view.mount / container).mkdir(parents=True)
    view.claim_cgroup(container)
    return hook(root, view, whole()[1], str(GIB))


@pytest.mark.parametrize(
    "container",
    [
        pytest.param(f"kubepods/besteffort/pod{POD}/c1", id="cgroupfs"),
        pytest.param(f"kubepods/pod{POD}/c1", id="cgroupfs-guaranteed"),
        pytest.param(
            "kubepods.slice/kubepods-burstable.slice/"
            f"kubepods-burstable-pod{SYSTEMD_POD}.slice/cri-containerd-c1.scope",
            id="systemd",
        ),
        pytest.param(f"kubepods.slice/kubepods-pod{SYSTEMD_POD}.slice/c1", id="systemd-guaranteed"),
        pytest.param(
            "kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
            f"kubelet-kubepods-besteffort-pod{SYSTEMD_POD}.slice/cri-containerd-c1.scope",
            id="systemd-cgroup-root",
        ),
        pytest.param(f"kubelet/kubepods/burstable/pod{POD}/c1", id="cgroupfs-cgroup-root"),
    ],
)
def test_a_pods_cgroup_is_found_as_either_cgroup_driver_names_it(
    root: Path, view: HookView, container: str
) -> None:
    done = hook_in(root, view, container)
    assert done.returncode == 0, done.stderr
    assert [r["nameSpace"] for r in records(root)] == [str((view.mount / container).parent)]


@pytest.mark.parametrize(
    "container",
    [
        pytest.param("kubepods/burstable/podnot-a-uid/c1", id="not-a-uid"),
        pytest.param(f"elsewhere/pod{POD}/c1", id="cgroupfs-not-under-kubepods"),
        pytest.param(f"kubepods/guests/pod{POD}/c1", id="cgroupfs-not-a-qos"),
        pytest.param(
            f"kubelet.slice/kubelet-notpods.slice/kubelet-notpods-pod{SYSTEMD_POD}.slice/c1",
            id="systemd-no-kubepods",
        ),
        pytest.param(
            f"kubepods.slice/xkubepods.slice/xkubepods-pod{SYSTEMD_POD}.slice/c1",
            id="systemd-kubepods-not-a-component",
        ),
        pytest.param(
            f"other.slice/kubepods-pod{SYSTEMD_POD}.slice/c1", id="systemd-not-in-its-slice"
        ),
        pytest.param(
            f"kubepods.slice/kubepods-guests.slice/kubepods-guests-pod{SYSTEMD_POD}.slice/c1",
            id="systemd-not-a-qos",
        ),
    ],
)
def test_a_container_whose_parent_is_no_pods_cgroup_caps_nothing(
    root: Path, view: HookView, container: str
) -> None:
    done = hook_in(root, view, container)
    assert done.returncode == 1
    assert "is not in a pod's cgroup" in done.stderr, done.stderr
    uncapped(view, root)


@pytest.mark.parametrize(
    ("cgroup", "message"),
    [
        pytest.param("..", "'..' component", id="parent-of-root"),
        pytest.param(f"kubepods/burstable/pod{POD}/c1/../..", "'..' component", id="up-to-qos"),
        pytest.param(f"kubepods/../kubepods/burstable/pod{POD}/c1", "'..' component", id="detour"),
        pytest.param(f"kubepods/burstable/pod{POD}/./c1", "'.' or '..'", id="dot"),
        pytest.param("", "is the root", id="root"),
        pytest.param(f"kubepods/burstable/pod{POD}", "is not in a pod's cgroup", id="pod-itself"),
        pytest.param(f"kubepods/burstable/pod{POD}/gone", "cannot be resolved", id="missing"),
    ],
)
def test_a_cgroup_path_that_is_not_plainly_a_pods_container_caps_nothing(
    root: Path, view: HookView, cgroup: str, message: str
) -> None:
    view.claim_cgroup(cgroup)
    done = hook(root, view, whole()[1], str(GIB))
    assert done.returncode == 1
    assert message in done.stderr, done.stderr
    uncapped(view, root)


@pytest.mark.parametrize("inside", [False, True], ids=["out-of-the-hierarchy", "to-another-pod"])
def test_a_container_cgroup_that_is_a_link_caps_nothing(
    root: Path, view: HookView, tmp_path: Path, inside: bool
) -> None:
    elsewhere = Path(view.enter(OTHER_POD, "c1")) if inside else tmp_path / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    (Path(view.pod()) / "linked").symlink_to(elsewhere)
    view.claim_cgroup(f"kubepods/burstable/pod{POD}/linked")
    done = hook(root, view, whole()[1], str(GIB))
    assert done.returncode == 1
    assert f"resolves to {elsewhere}, not a directory below" in done.stderr, done.stderr
    uncapped(view, root)


@pytest.mark.parametrize(
    ("reachable", "message"),
    [
        pytest.param(False, "cannot open the host's cgroup namespace", id="unopenable"),
        pytest.param(True, "cannot enter the host's cgroup namespace", id="not-entered"),
    ],
)
def test_without_the_hosts_cgroup_namespace_nothing_is_capped(
    root: Path, view: HookView, reachable: bool, message: str
) -> None:
    view.foreign_namespace("cgroup", reachable)
    done = hook(root, view, whole()[1], str(GIB))
    assert done.returncode == 1
    assert message in done.stderr and "nothing is capped" in done.stderr, done.stderr
    uncapped(view, root)


def test_a_user_namespaced_pod_is_told_why_it_cannot_be_capped(root: Path, view: HookView) -> None:
    view.foreign_namespace("user", reachable=True)
    done = hook(root, view, whole()[1], str(GIB))
    assert done.returncode == 1
    assert "hostUsers: false" in done.stderr and "cgroup is the root" not in done.stderr, (
        done.stderr
    )
    uncapped(view, root)


def test_a_link_at_the_scratch_path_is_not_followed(
    root: Path, view: HookView, tmp_path: Path
) -> None:
    target = tmp_path / "host-file"
    target.write_text("kept\n")
    records_dir = root.parent / "records"
    plant = 'ln -s "$1" "$2/.$$.tmp" && shift 2 && exec "$@"'  # the hook keeps the shell's pid
    prefix = ("sh", "-c", plant, "sh", str(target), str(records_dir))
    done = run_hook(hook_program(), args(root, whole()[1], str(GIB)), view, prefix=prefix)
    assert done.returncode == 0, done.stderr
    assert target.read_text() == "kept\n"
    assert len(records(root)) == 1


def test_a_state_that_never_ends_fails_the_hook(root: Path, view: HookView) -> None:
    status, stderr = finish(stalled_hook(hook_program(), args(root, whole()[1], str(GIB)), view))
    assert status == 1
    assert "stdin: the container's state did not end within" in stderr, stderr
    uncapped(view, root)


def test_the_containers_of_a_pod_share_one_cap(root: Path, view: HookView) -> None:
    gpu, uuid = whole()
    for container in ("init", "main", "sidecar"):
        view.enter(POD, container)
        done = hook(root, view, uuid, str(20 * GIB))
        assert done.returncode == 0, done.stderr
    assert get_limits(gpu, view.pod()) == (20 * GIB, 20 * GIB, 0)
    assert [r["nameSpace"] for r in records(root)] == [view.pod()]


def first_pod_capped(root: Path, view: HookView) -> tuple[Any, str]:
    """The whole GPU (handle, UUID), 20 GiB of it CLAIM's share, capped in the first pod."""
    gpu, uuid = whole()
    assert hook(root, view, uuid, str(20 * GIB)).returncode == 0
    return gpu, uuid


def test_a_second_pod_on_a_claims_share_is_refused_while_the_first_runs(
    root: Path, view: HookView
) -> None:
    gpu, uuid = first_pod_capped(root, view)
    view.enter(OTHER_POD, "c1")
    done = hook(root, view, uuid, str(20 * GIB))
    assert done.returncode == 1
    assert f"capped in the pod cgroup {view.pod()} already" in done.stderr, done.stderr
    with pytest.raises(n.NVMLError_NotFound):
        get_limits(gpu, view.pod(OTHER_POD))
    assert get_limits(gpu, view.pod()) == (20 * GIB, 20 * GIB, 0)
    shutil.rmtree(view.pod())  # the first pod is gone, and its cap with it
    assert hook(root, view, uuid, str(20 * GIB)).returncode == 0
    assert get_limits(gpu, view.pod(OTHER_POD)) == (20 * GIB, 20 * GIB, 0)
    assert [r["nameSpace"] for r in records(root)] == [view.pod(OTHER_POD)]


def test_two_claims_shares_of_one_gpu_in_one_pod_cap_it_at_their_sum(
    root: Path, view: HookView
) -> None:
    gpu, uuid = first_pod_capped(root, view)
    view.enter(POD, "c2")
    assert hook(root, view, uuid, str(10 * GIB), claim=OTHER_CLAIM).returncode == 0
    assert get_limits(gpu, view.pod()) == (30 * GIB, 30 * GIB, 0)
    assert sorted(r["limit"] for r in records(root)) == [10 * GIB, 20 * GIB]


def test_a_share_on_two_gpus_gets_a_record_each(root: Path, view: HookView) -> None:
    uuids = [n.nvmlDeviceGetUUID(n.nvmlDeviceGetHandleByIndex(i)) for i in (4, 5)]
    for uuid in uuids:
        assert hook(root, view, uuid, str(GIB)).returncode == 0
    assert sorted(r["gpu"] for r in records(root)) == sorted(uuids)


def older_record(root: Path, name: str, **fields: Any) -> Path:
    """A record as the hook wrote it before records were kept per pod: keyed by its container's
    cgroup, its strings escaped as JSON escapes them."""
    entry = {"claim": OTHER_CLAIM, "share": SHARE, "gpu": whole()[1], "limit": GIB, **fields}
    path = root.parent / "records" / name
    path.write_text(json.dumps(entry) + "\n")
    return path


def test_another_claims_record_that_cannot_be_read_is_skipped_and_named(
    root: Path, view: HookView
) -> None:
    escaped = older_record(
        root, f"{OTHER_CLAIM}_{SHARE}_0.json", nameSpace=f'{view.pod()}/c"1'
    )  # json.dumps writes \" into the file
    done = hook(root, view, whole()[1], str(20 * GIB))
    assert done.returncode == 0, done.stderr
    assert f"memory-limit-hook: skipping the record {escaped}, which cannot be read" in done.stderr
    assert get_limits(whole()[0], view.pod()) == (20 * GIB, 20 * GIB, 0)
    assert escaped.exists()


def test_this_shares_record_that_cannot_be_read_still_refuses(root: Path, view: HookView) -> None:
    older_record(root, f"{CLAIM}_{SHARE}_0.json", claim=CLAIM, nameSpace='/x/c"1')
    done = hook(root, view, whole()[1], str(GIB))
    assert done.returncode == 1
    assert "of this share: it may be capped in another pod" in done.stderr, done.stderr


def test_an_older_hooks_record_of_a_container_of_this_pod_is_the_same_pod(
    root: Path, view: HookView
) -> None:
    container = view.enter(POD, "c1")
    older_record(root, f"{CLAIM}_{SHARE}_0.json", claim=CLAIM, nameSpace=container)
    view.enter(POD, "c2")
    done = hook(root, view, whole()[1], str(GIB))
    assert done.returncode == 0, done.stderr
    assert get_limits(whole()[0], view.pod()) == (GIB, GIB, 0)
    assert sorted(r["nameSpace"] for r in records(root)) == [view.pod(), container]
