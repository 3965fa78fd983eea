"""MPS sharing from the Helm chart under the real kubelet, scheduler and API server
(`make e2e-cluster`).

Installed as an operator would (`helm install` of manifests/helm/deviceplugin with
e2e/cluster/values-mps.yaml: NVIDIA's example config, every GPU shared 4 ways through MPS, on
the simulated a100-80gb-x8-mixed node with migStrategy none, so its 8 GPUs are 32 replicas). The
plugin runs the simulated nvidia-cuda-mps-control of the driver root, whose daemon writes the
limits it was told into its pipe directory under mps.root: the host reads them there, the pods
through the pipe mount Allocate gave them. Scenarios run in file order.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deviceplugin.sim.node import read_node, resolve_node_path
from e2e.cluster.kube import (
    REPO,
    apply,
    daemon_pod,
    daemon_ready,
    delete_workloads,
    exec_in,
    extended,
    get,
    helm,
    kubectl,
    pod_running,
    wait_until,
    workload_pod,
)

GPU = "nvidia.com/gpu"
RELEASE = "mps"
NAMESPACE = "kube-system"
CHART = REPO / "manifests" / "helm" / "deviceplugin"
VALUES = REPO / "e2e" / "cluster" / "values-mps.yaml"
PLUGIN_LABEL = f"app.kubernetes.io/name=deviceplugin,app.kubernetes.io/instance={RELEASE}"
NODE = read_node(resolve_node_path("a100-80gb-x8-mixed"))
MPS_ROOT = Path("/run/nvidia/mps")  # the chart's mps.root
HOST_PIPE = MPS_ROOT / GPU / "pipe"
CONTAINER_PIPE = f"/mps/{GPU}/pipe"  # where NVIDIA's plugin puts it, and so this one
LIMITS = "deviceplugin-sim-mps.json"  # what the simulated daemon was told
# The ConfigMap reaches the pod at the kubelet's next volume sync (about a minute by default).
CONFIGMAP_SYNC = 180


def daemon_limits() -> dict[str, Any] | None:
    """The running daemon's limits, read on the host; None while no daemon serves."""
    try:
        found: dict[str, Any] = json.loads((HOST_PIPE / LIMITS).read_text())
    except (OSError, ValueError):
        return None
    return found


def expected_limits(replicas: int) -> dict[str, Any]:
    """NVIDIA's: 100/replicas percent of the threads, memory/replicas MiB pinned per GPU."""
    return {
        "activeThreadPercentage": 100 // replicas,
        "pinnedDeviceMemoryLimitMiB": {
            str(gpu.index): gpu.memory_mib // replicas for gpu in NODE.gpus
        },
    }


def limits_are(replicas: int) -> dict[str, Any] | None:
    limits = daemon_limits()
    if limits is None:
        return None
    expected = expected_limits(replicas)
    return limits if {key: limits.get(key) for key in expected} == expected else None


def identity() -> tuple[str, int]:
    """The plugin pod's UID and its container's restart count."""
    found = daemon_pod(PLUGIN_LABEL)
    (status,) = found["status"]["containerStatuses"]
    return str(found["metadata"]["uid"]), int(status["restartCount"])


def config_map() -> str:
    selector = f"app.kubernetes.io/instance={RELEASE}"
    (found,) = get("configmaps", "-n", NAMESPACE, "-l", selector)["items"]
    return str(found["metadata"]["name"])


def set_replicas(replicas: int) -> None:
    """Edit the release's ConfigMap in place, as an operator would with kubectl."""
    text = yaml_config(replicas)
    patch = json.dumps({"data": {"mps": text}})
    kubectl("patch", "configmap", "-n", NAMESPACE, config_map(), "--type", "merge", "-p", patch)


def yaml_config(replicas: int) -> str:
    return (
        "version: v1\nflags:\n  migStrategy: none\nsharing:\n  mps:\n    resources:\n"
        f"      - name: nvidia.com/gpu\n        replicas: {replicas}"
    )


def plugin_log() -> str:
    return kubectl("logs", "-n", NAMESPACE, daemon_ready(PLUGIN_LABEL) or "")


@pytest.fixture(scope="module", autouse=True)
def release() -> Iterator[None]:
    helm("install", RELEASE, str(CHART), "--values", str(VALUES), "--wait", "--timeout", "240s")
    wait_until("the plugin pod Ready", lambda: daemon_ready(PLUGIN_LABEL), timeout=240)
    yield
    delete_workloads()
    if RELEASE in helm("list", "--short").split():
        helm("uninstall", RELEASE, "--wait", "--timeout", "120s")
    wait_until("the daemon gone with the plugin", lambda: daemon_limits() is None, timeout=60)
    shutil.rmtree(MPS_ROOT, ignore_errors=True)  # the host as the suite found it


@pytest.fixture(scope="module")
def first_pod() -> tuple[str, int]:
    return identity()


@pytest.fixture(autouse=True)
def no_workloads_left() -> Iterator[None]:
    yield
    delete_workloads()


def test_the_daemon_serves_every_gpu_4_ways_with_nvidias_limits(
    first_pod: tuple[str, int],
) -> None:
    wait_until(f"{GPU} allocatable 32", lambda: extended(GPU) == 32, timeout=120)
    limits = wait_until("the daemon's limits for 4 replicas", lambda: limits_are(4), timeout=60)
    assert limits["activeThreadPercentage"] == 25
    assert "mps.daemon_started" in plugin_log()
    assert identity() == (first_pod[0], 0)


def test_four_pods_see_the_pipe_the_daemon_and_one_shm() -> None:
    names = [f"mps-{n}" for n in range(4)]
    for name in names:
        apply(workload_pod(name, {GPU: "1"}))
    for name in names:
        wait_until(f"pod {name} Running", lambda: pod_running(name), timeout=180)  # noqa: B023
    host_limits = daemon_limits()
    for name in names:
        pipe = exec_in(name, "sh", "-c", "echo $CUDA_MPS_PIPE_DIRECTORY").strip()
        assert pipe == CONTAINER_PIPE, name
        assert "control" in exec_in(name, "ls", pipe).split(), name  # the daemon's socket
        seen = json.loads(exec_in(name, "cat", f"{pipe}/{LIMITS}"))
        assert seen == host_limits, name
    # /dev/shm is the host's <mps.root>/shm, one for the daemon and all its clients
    exec_in(names[0], "sh", "-c", "echo from-mps-0 > /dev/shm/e2e-mps")
    try:
        for name in names[1:]:
            assert exec_in(name, "cat", "/dev/shm/e2e-mps").strip() == "from-mps-0", name
        assert (MPS_ROOT / "shm" / "e2e-mps").read_text().strip() == "from-mps-0"
    finally:
        (MPS_ROOT / "shm" / "e2e-mps").unlink(missing_ok=True)


def test_a_configmap_edit_to_2_replicas_lands_without_a_restart(
    first_pod: tuple[str, int],
) -> None:
    set_replicas(2)
    wait_until(f"{GPU} allocatable 16", lambda: extended(GPU) == 16, timeout=CONFIGMAP_SYNC)
    limits = wait_until("the daemon's limits for 2 replicas", lambda: limits_are(2), timeout=60)
    assert limits["activeThreadPercentage"] == 50

    # Refused, naming the field: the last good config (2 replicas) keeps serving.
    set_replicas(1)
    field = "sharing.mps.resources[0].replicas"
    wait_until(f"the plugin's log naming {field}", lambda: field in plugin_log(), CONFIGMAP_SYNC)
    assert extended(GPU) == 16
    assert limits_are(2) is not None
    assert identity() == (first_pod[0], 0)
