"""The cluster reaps what it starts (`make e2e-cluster`, after the scenarios, which created and
deleted dozens of pods, restarted the kubelet and replaced the plugins' pods): each component is
the reaper's child, and so is each pod's containerd shim once its starter has exited, so a shim
whose pod is gone is collected instead of staying `<defunct>`."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from e2e.cluster import processes as node_processes
from e2e.cluster.kube import apply, delete_workloads, pod_running, wait_until, workload_pod


def shims(processes: dict[int, tuple[str, str, int]] | None = None) -> dict[int, int]:
    """pid -> parent pid of every containerd shim, in `processes` or in a fresh look."""
    return {
        pid: ppid
        for pid, (comm, state, ppid) in (processes or node_processes.processes()).items()
        if comm == "containerd-shim" and state != "Z"
    }


@pytest.fixture
def running_pod() -> Iterator[None]:
    apply(workload_pod("reaped", {}))
    wait_until("pod reaped Running", lambda: pod_running("reaped"), timeout=180)
    yield
    delete_workloads()


def test_components_and_shims_are_the_reapers_children(running_pod: None) -> None:
    reaper = node_processes.pid_of(node_processes.REAPER)
    assert reaper, "no reaper running"
    processes = node_processes.processes()
    for name in node_processes.STOP_ORDER:
        pid = node_processes.pid_of(name)
        assert pid and processes[pid][2] == reaper, f"{name}: {processes.get(pid or 0)}"
    found = shims(processes)
    assert found, "no shim: the check would prove nothing"
    assert set(found.values()) == {reaper}


def test_a_deleted_pods_shim_is_reaped_not_left_defunct(running_pod: None) -> None:
    before = set(shims())
    delete_workloads()
    wait_until("the pod's shim to exit", lambda: set(shims()) < before, timeout=60)
    # The reaper collects within a second; a zombie older than that has nobody to reap it.
    deadline = time.monotonic() + 5
    while node_processes.defunct() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert node_processes.defunct() == []
