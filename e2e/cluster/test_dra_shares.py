"""GPU memory shares under the real scheduler and kubelet (`make e2e-cluster`).

The driver deployed with shares on (`manifests/overlays/simulated-node-dra-shares`), every claim
pinned to one whole 80 GiB GPU of the simulated node by its `uuid`. Checked through the API
(allocation results, the scheduler's reason on a pod it cannot place), inside each container of
our image (its nvidia-ml-py on the `libnvidia-ml.so.1` the claim's CDI spec mounts: the cap the
createContainer hook set, seen from the container's own cgroup) and on the host (the simulated
library's limits file, empty once the pods are gone). Two shares with NVIDIA's opaque MPS config
share one control daemon on the GPU (docs/dra/sharing.md "MPS: one control daemon per
device"), checked in the containers (the pipe, each claim's limits) and on the host (the
daemon's process and pid file under the driver's plugin directory, the GPU's compute mode
through the simulated NVML).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from deviceplugin.sim.node import read_node, resolve_node_path
from e2e.cluster.kube import (
    REPO,
    SIMULATED_NODE,
    Obj,
    apply,
    exec_in,
    get,
    kubectl,
    pod,
    pod_running,
    unschedulable_reason,
    wait_until,
)
from e2e.cluster.served import observed, served, version
from e2e.cluster.simlibrary import compute_mode
from e2e.cluster.test_dra import (
    DRIVER,
    DRIVER_ROOT,
    attribute,
    cdi_spec_of,
    claim_uid,
    driver_ready,
    driver_says_gate_off,
    driver_status,
    published,
    start,
)

GATE = "DRAConsumableCapacity"  # shares' capacity and allowMultipleAllocations (on from 1.36)
OVERLAY = REPO / "manifests" / "overlays" / "simulated-node-dra-shares"
IMAGE = os.environ.get("E2E_IMAGE", "localhost/deviceplugin:e2e")  # has nvidia-ml-py
LABEL = "e2e=dra-shares"
LIMITS = SIMULATED_NODE / "root" / "etc" / "deviceplugin-sim" / "memory-limits.json"
GIB = 1 << 30
GPU = next(g for g in read_node(resolve_node_path("a100-80gb-x8-mixed")).gpus if not g.mig_enabled)
# nvmlDeviceGetMemoryInfo_v2 on the pinned GPU, as the container's process sees it.
MEMORY_TOTAL = (
    "import sys, pynvml; pynvml.nvmlInit(); "
    "handle = pynvml.nvmlDeviceGetHandleByUUID(sys.argv[1]); "
    "print(pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2).total)"
)


def template(
    name: str,
    memory: str | None,
    mps: Obj | None = None,
    device_class: str = "gpu-shared.nvidia.com",
    namespace: str = "default",
) -> Obj:
    """A claim template in `namespace` for the pinned GPU of `device_class`, asking `memory` of
    it (None: no capacity), with NVIDIA's opaque GpuConfig sharing it through MPS with `mps` as
    its mpsConfig."""
    exactly: Obj = {
        "deviceClassName": device_class,
        "selectors": [
            {"cel": {"expression": f"device.attributes['{DRIVER}'].uuid == '{GPU.uuid}'"}}
        ],
    }
    if memory is not None:
        exactly["capacity"] = {"requests": {"memory": memory}}
    devices: Obj = {"requests": [{"name": "gpu", "exactly": exactly}]}
    if mps is not None:
        parameters = {
            "apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "GpuConfig",
            "sharing": {"strategy": "MPS", "mpsConfig": mps},
        }
        devices["config"] = [
            {"requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": parameters}}
        ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": {"devices": devices}},
    }


def share_pod(
    name: str, claim_template: str, label: str = "dra-shares", namespace: str = "default"
) -> Obj:
    """A pod of our image in `namespace`, labelled `e2e=<label>`, that sleeps holding a claim
    from `claim_template`."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"e2e": label}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": claim_template}],
            "containers": [
                {
                    "name": "work",
                    "image": IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["sleep", "3600"],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }


def result_of(pod_name: str, namespace: str = "default") -> Obj:
    """The one allocation result of the pod's claim, as the scheduler wrote it."""
    (status,) = pod(pod_name, namespace)["status"]["resourceClaimStatuses"]
    claim = get("resourceclaim", status["resourceClaimName"], "-n", namespace)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    found: Obj = result
    return found


def memory_seen(pod_name: str) -> int:
    return int(exec_in(pod_name, "python", "-c", MEMORY_TOTAL, GPU.uuid))


def limits_left() -> list[Obj]:
    """The limits the simulated library holds on the host, for every GPU and cgroup."""
    if not LIMITS.exists():
        return []
    entries: list[Obj] = json.loads(LIMITS.read_text())["limits"]
    return entries


def pending_reason(name: str) -> str:
    reason = wait_until(
        f"{name} Pending with the scheduler's reason", lambda: unschedulable_reason(name), 60
    )
    assert pod(name)["status"]["phase"] == "Pending", reason
    assert "cannot allocate all claims" in reason, reason
    return reason


def delete_pods(*names: str) -> None:
    """Delete pods (all of this file's when none is named) and wait until their claims are
    unprepared on the host."""
    targets = names or tuple(
        p["metadata"]["name"] for p in get("pods", "-n", "default", "-l", LABEL)["items"]
    )
    uids = [claim_uid(n) for n in targets if pod(n)["status"].get("resourceClaimStatuses")]
    selector = ["-l", LABEL] if not names else list(names)
    kubectl("delete", "pod", "-n", "default", *selector, "--wait=true", "--timeout=120s")
    wait_until("their claims unprepared", lambda: not any(cdi_spec_of(u).exists() for u in uids))


@pytest.fixture(scope="module", autouse=True)
def shares_driver() -> Iterator[None]:
    kubectl("apply", "-k", str(OVERLAY))
    if served(GATE):
        wait_until("the driver pod Ready", driver_ready, timeout=240)
        wait_until(
            "the GPU published shareable", lambda: pinned_device().get("allowMultipleAllocations")
        )
    else:
        wait_until(f"the driver naming {GATE}", lambda: driver_says_gate_off(GATE), timeout=240)
    apply(template("share-20gi", "20Gi"))
    apply(template("share-whole-gpu", None))
    apply(
        template(
            "mps-half",
            "20Gi",
            {"defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "10Gi"},
        )
    )
    apply(
        template(
            "mps-quarter",
            "20Gi",
            {"defaultActiveThreadPercentage": 25, "defaultPinnedDeviceMemoryLimit": "5Gi"},
        )
    )
    yield
    kubectl("delete", "pod", "-n", "default", "-l", LABEL, "--wait=true", "--timeout=120s")
    kubectl("delete", "-k", str(OVERLAY), "--wait=true", "--timeout=120s", check=False)


@pytest.fixture(autouse=True)
def no_pods_left() -> Iterator[None]:
    yield
    delete_pods()


def needs_capacity() -> None:
    """The scenarios below need consumable capacity; where the cluster's gates drop it,
    test_without_consumable_capacity_no_share_is_published asserts what the driver does."""
    if not served(GATE):
        pytest.skip(f"{GATE} off on Kubernetes {version()}: the degraded scenario runs instead")


def pinned_device() -> Obj:
    return next(d for d in published().values() if attribute(d, "uuid") == GPU.uuid)


def test_four_20gi_shares_fill_the_gpu_each_capped_and_a_fifth_waits_for_one() -> None:
    needs_capacity()
    assert GPU.memory_mib == 80 * 1024
    names = [start(share_pod(f"share-{n}", "share-20gi")) for n in range(4)]
    results = [result_of(name) for name in names]
    assert {r["device"] for r in results} == {pinned_device()["name"]}
    assert len({r["shareID"] for r in results}) == 4, results
    assert all(r["consumedCapacity"]["memory"] == "20Gi" for r in results), results
    observed(GATE, "kept: four 20Gi shares of one GPU, each capped")
    for name in names:  # the cap of its own cgroup, through the library the CDI spec mounts
        assert memory_seen(name) == 20 * GIB, name
    assert len({entry["nameSpace"] for entry in limits_left()}) == 4

    apply(share_pod("share-4", "share-20gi"))
    pending_reason("share-4")
    delete_pods(names[0])
    wait_until("share-4 Running on the freed share", lambda: pod_running("share-4"), 180)
    assert result_of("share-4")["device"] == pinned_device()["name"]
    assert memory_seen("share-4") == 20 * GIB

    delete_pods()
    assert limits_left() == []


def test_a_claim_asking_no_capacity_gets_the_gpu_alone() -> None:
    needs_capacity()
    whole = start(share_pod("whole", "share-whole-gpu"))
    assert result_of(whole)["consumedCapacity"]["memory"] == "80Gi"
    assert memory_seen(whole) == 80 * GIB
    apply(share_pod("beside-whole", "share-20gi"))
    pending_reason("beside-whole")
    delete_pods(whole)
    wait_until(
        "beside-whole Running once the GPU is free", lambda: pod_running("beside-whole"), 180
    )
    assert memory_seen("beside-whole") == 20 * GIB
    delete_pods()
    assert limits_left() == []


# What a container of an MPS claim sees: its MPS variables, and whether the pipe directory they
# name holds the daemon's control socket and pid file (mounted from the daemon's home).
MPS_SEEN = (
    "import json, os, stat; pipe = os.environ.get('CUDA_MPS_PIPE_DIRECTORY', '');"
    " socket = os.path.join(pipe, 'control');"
    " pid = os.path.join(pipe, 'nvidia-cuda-mps-control.pid');"
    " print(json.dumps({'env': {k: v for k, v in os.environ.items() if k.startswith('CUDA_MPS_')},"
    " 'socket': os.path.exists(socket) and stat.S_ISSOCK(os.stat(socket).st_mode),"
    " 'pid': open(pid).read().strip() if os.path.exists(pid) else None}))"
)
MPS_HOMES = Path("/var/lib/kubelet/plugins") / DRIVER / "mps"
DAEMON = b"nvidia-cuda-mps-control"
EXCLUSIVE_PROCESS, DEFAULT = 3, 0


def mps_seen(pod_name: str, namespace: str = "default") -> Obj:
    seen: Obj = json.loads(exec_in(pod_name, "python", "-c", MPS_SEEN, namespace=namespace))
    return seen


def daemons_on(pipe_dir: Path) -> list[int]:
    """The host pids of the control daemons (`-d`) serving `pipe_dir`, from /proc."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            environ = (proc / "environ").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue  # not a process, or one that exited
        serving = f"CUDA_MPS_PIPE_DIRECTORY={pipe_dir}".encode() in environ
        if argv[0].endswith(DAEMON) and b"-d" in argv[1:] and serving:
            found.append(int(proc.name))
    return found


def namespace_pid(host_pid: int) -> int:
    """The pid a host process has in its own (the driver container's) pid namespace."""
    status = Path(f"/proc/{host_pid}/status").read_text()
    (line,) = (ln for ln in status.splitlines() if ln.startswith("NSpid:"))
    return int(line.split()[-1])


def test_two_mps_claims_on_one_gpu_share_one_daemon_each_with_its_limits() -> None:
    needs_capacity()
    half = start(share_pod("mps-half", "mps-half"))
    quarter = start(share_pod("mps-quarter", "mps-quarter"))
    device = pinned_device()["name"]
    assert {result_of(half)["device"], result_of(quarter)["device"]} == {device}
    assert result_of(half)["shareID"] != result_of(quarter)["shareID"]

    seen = {name: mps_seen(name) for name in (half, quarter)}
    assert seen[half]["env"] == {
        "CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=10240M",
    }, seen
    assert seen[quarter]["env"] == {
        "CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=5120M",
    }, seen
    assert seen[half]["socket"] and seen[quarter]["socket"], seen

    # One daemon on the host for the GPU, the one whose pid both containers read.
    assert sorted(p.name for p in MPS_HOMES.iterdir()) == [device]
    pipe = MPS_HOMES / device / "pipe"
    (daemon,) = daemons_on(pipe)
    assert seen[half]["pid"] == seen[quarter]["pid"] == str(namespace_pid(daemon)), seen
    assert compute_mode(DRIVER_ROOT, GPU.uuid) == EXCLUSIVE_PROCESS

    delete_pods(half)
    assert daemons_on(pipe) == [daemon], "the daemon stays while a claim on the GPU uses it"
    assert compute_mode(DRIVER_ROOT, GPU.uuid) == EXCLUSIVE_PROCESS
    delete_pods(quarter)
    wait_until("the daemon gone after the last Unprepare", lambda: not daemons_on(pipe))
    assert not (MPS_HOMES / device).exists()
    assert compute_mode(DRIVER_ROOT, GPU.uuid) == DEFAULT


def test_without_consumable_capacity_no_share_is_published() -> None:
    """Where the API server drops consumable capacity (1.34, 1.35 by default), `--gpu-sharing
    memory` publishes whole GPUs without shares: a share claim waits rather than being handed a
    GPU another claim has, the driver names the gate, and a whole GPU still serves."""
    if served(GATE):
        pytest.skip(f"{GATE} on: the scenarios above run")
    wait_until(
        "the GPU published",
        lambda: GPU.uuid in {attribute(d, "uuid") for d in published().values()},
    )
    device = pinned_device()
    assert "allowMultipleAllocations" not in device, device
    assert "requestPolicy" not in device.get("capacity", {}).get("memory", {}), device
    assert not device["attributes"].get("nvidia.com/memoryShares", {}).get("bool"), device
    status = driver_status()
    assert (
        status["server_features"]["known"] and not status["server_features"]["consumable_capacity"]
    )
    assert [why for why in status["not_ready"] if GATE in why], status["not_ready"]
    apply(share_pod("share-waits", "share-20gi"))
    pending_reason("share-waits")
    apply(template("whole-plain", None, device_class="gpu.nvidia.com"))
    name = start(share_pod("whole-plain", "whole-plain"))
    assert result_of(name)["device"] == device["name"]
    assert "shareID" not in result_of(name)
    observed(GATE, "dropped: whole GPUs without shares; the driver names the gate")
