"""The device plugin under the real kubelet, scheduler and API server (`make e2e-cluster`).

Deployed as a user would (`kubectl apply -k manifests/overlays/simulated-node`: the shipped
DaemonSet and seed ConfigMap on a simulated a100-80gb-x8-mixed node with cdi-cri), then checked
only through the API and the workloads themselves: the Node's allocatable, where the scheduler
put pods and why it did not, what containerd gave each container. Scenarios run in file order;
each leaves the plugin as it found it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from deviceplugin.sim.node import read_node, resolve_node_path
from e2e.cluster.kube import (
    EVENTS,
    REPO,
    SIMULATED_NODE,
    Obj,
    append_event,
    apply,
    cluster,
    daemon_pod,
    daemon_ready,
    delete_workloads,
    exec_in,
    extended,
    kubectl,
    pod,
    pod_running,
    replace_daemon_pod,
    unschedulable_reason,
    wait_until,
    workload_pod,
)
from e2e.cluster.served import observed
from e2e.runtime import LIST_NODES, device_nodes, expected_nodes

GPU, MIG = "nvidia.com/gpu", "nvidia.com/mig-1g.10gb"
NODE = read_node(resolve_node_path("a100-80gb-x8-mixed"))
DRIVER_ROOT = SIMULATED_NODE / "root"
OVERLAY = REPO / "manifests" / "overlays" / "simulated-node"
SEED_CONFIGMAP = (REPO / "manifests" / "configmap.yaml").read_text()
PLUGIN = ("-n", "kube-system")
PLUGIN_LABEL = "app.kubernetes.io/name=deviceplugin"


def plugin_pod() -> Obj:
    return daemon_pod(PLUGIN_LABEL)


def plugin_ready() -> str | None:
    return daemon_ready(PLUGIN_LABEL)


def whole_gpus() -> list[dict[str, tuple[int, int]]]:
    return [expected_nodes(DRIVER_ROOT, NODE, gpu.uuid) for gpu in NODE.gpus if not gpu.mig_enabled]


def mig_slices() -> list[dict[str, tuple[int, int]]]:
    return [
        expected_nodes(DRIVER_ROOT, NODE, mig.uuid)
        for gpu in NODE.gpus
        for mig in gpu.mig_devices
        if mig.profile == "1g.10gb"
    ]


def seen(name: str) -> dict[str, tuple[int, int]]:
    return device_nodes(exec_in(name, "sh", "-c", LIST_NODES))


def gpu_minor(nodes: dict[str, tuple[int, int]]) -> int:
    minors = [minor for path, (_, minor) in nodes.items() if path[len("/dev/nvidia") :].isdigit()]
    assert len(minors) == 1, nodes
    return minors[0]


def start_pods(limits: dict[str, str], *names: str) -> None:
    for name in names:
        apply(workload_pod(name, limits))
    for name in names:
        wait_until(f"pod {name} Running", lambda: pod_running(name), timeout=180)  # noqa: B023


def with_replicas(replicas: int | str) -> str:
    return SEED_CONFIGMAP.replace("replicas: 2", f"replicas: {replicas}")


@pytest.fixture(scope="module", autouse=True)
def device_plugin() -> Iterator[None]:
    kubectl("apply", "-k", str(OVERLAY))
    wait_until("the plugin pod Ready", plugin_ready, timeout=240)
    wait_until(f"{GPU} allocatable", lambda: extended(GPU) == 8, timeout=120)
    yield
    delete_workloads()
    kubectl("delete", "-k", str(OVERLAY), "--wait=true", "--timeout=120s", check=False)
    EVENTS.write_text("")  # the Xid scenario's GPU is healthy again for whoever comes next


@pytest.fixture(autouse=True)
def no_workloads_left() -> Iterator[None]:
    yield
    delete_workloads()


def test_seed_configmap_gives_8_gpu_replicas_and_28_mig_slices() -> None:
    assert wait_until(f"{MIG} allocatable", lambda: extended(MIG) == 28, timeout=60)
    assert extended(GPU) == 8


def test_pods_see_exactly_their_devices_through_cdi() -> None:
    start_pods({GPU: "1"}, "one-gpu")
    start_pods({MIG: "1"}, "one-mig")
    gpu_nodes, mig_nodes = seen("one-gpu"), seen("one-mig")
    assert gpu_nodes in whole_gpus(), gpu_nodes
    assert mig_nodes in mig_slices(), mig_nodes
    assert pod("one-gpu")["spec"]["nodeName"] == "deviceplugin-e2e"

    report = exec_in(
        plugin_ready() or "",
        "deviceplugin",
        "inspect",
        "--pods",
        "-o",
        "json",
        "--from",
        "http://127.0.0.1:8080",
        namespace="kube-system",
    )
    holders = json.dumps(json.loads(report))
    assert "default/one-gpu" in holders or '"one-gpu"' in holders, report
    assert "default/one-mig" in holders or '"one-mig"' in holders, report


def test_replicas_of_one_gpu_are_shared_by_two_pods() -> None:
    names = [f"replica-{n}" for n in range(8)]
    start_pods({GPU: "1"}, *names)
    per_gpu: dict[int, list[str]] = {}
    for name in names:
        per_gpu.setdefault(gpu_minor(seen(name)), []).append(name)
    # 8 replicas of 4 whole GPUs, all taken: each GPU serves exactly two pods.
    assert sorted(len(pods) for pods in per_gpu.values()) == [2, 2, 2, 2], per_gpu
    observed("device plugin", "8 nvidia.com/gpu replicas and 28 MIG devices, pods served by CDI")


def test_configmap_edit_reaches_the_plugin_without_a_restart() -> None:
    before = plugin_pod()
    try:
        kubectl("apply", "-f", "-", stdin=with_replicas(4))
        wait_until(f"{GPU} allocatable 16", lambda: extended(GPU) == 16, timeout=180)
        kubectl("apply", "-f", "-", stdin=with_replicas("many"))
        field = "sharing.timeSlicing.resources[0].replicas"
        wait_until(
            "the plugin's log naming the bad field",
            lambda: field in kubectl("logs", *PLUGIN, plugin_ready() or ""),
            timeout=180,
        )
        assert extended(GPU) == 16 and extended(MIG) == 28
    finally:
        kubectl("apply", "-f", "-", stdin=SEED_CONFIGMAP)
        wait_until(f"{GPU} allocatable back to 8", lambda: extended(GPU) == 8, timeout=180)
    after = plugin_pod()
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert after["status"]["containerStatuses"][0]["restartCount"] == 0


def test_kubelet_restart_re_registers_and_keeps_pods() -> None:
    start_pods({GPU: "1"}, "survivor")
    devices = seen("survivor")
    cluster("restart", "kubelet")
    wait_until(f"{GPU} allocatable 8", lambda: extended(GPU) == 8, timeout=180)
    wait_until(f"{MIG} allocatable 28", lambda: extended(MIG) == 28, timeout=60)
    # The restarted kubelet answers exec for the pod once it has synced it again.
    wait_until("survivor's devices through the new kubelet", lambda: seen("survivor") == devices)
    status = pod("survivor")["status"]
    assert status["phase"] == "Running"
    assert status["containerStatuses"][0]["restartCount"] == 0


def test_plugin_pod_deleted_is_recreated_and_pods_keep_devices() -> None:
    start_pods({GPU: "1"}, "survivor")
    devices = seen("survivor")
    replace_daemon_pod(PLUGIN_LABEL)
    wait_until(f"{GPU} allocatable 8", lambda: extended(GPU) == 8, timeout=120)
    assert pod("survivor")["status"]["containerStatuses"][0]["restartCount"] == 0
    assert seen("survivor") == devices


def test_xid_79_takes_a_gpu_away_without_killing_its_pods() -> None:
    start_pods({GPU: "1"}, "on-failing-gpu")
    minor = gpu_minor(seen("on-failing-gpu"))
    failing = next(gpu for gpu in NODE.gpus if gpu.minor == minor)
    append_event({"uuid": failing.uuid, "xid": 79})
    wait_until(f"{GPU} allocatable 6", lambda: extended(GPU) == 6, timeout=60)
    # 6 replicas left, 1 of them in use: a pod asking for 6 cannot fit.
    apply(workload_pod("too-big", {GPU: "6"}))
    reason = wait_until(
        "too-big Pending with the scheduler's reason",
        lambda: unschedulable_reason("too-big"),
        timeout=60,
    )
    assert f"Insufficient {GPU}" in reason
    assert pod("too-big")["status"]["phase"] == "Pending"
    status = pod("on-failing-gpu")["status"]
    assert status["phase"] == "Running" and status["containerStatuses"][0]["restartCount"] == 0
