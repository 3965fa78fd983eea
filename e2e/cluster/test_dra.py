"""The DRA driver under the real kubelet, scheduler and API server (`make e2e-cluster`).

Deployed as a user would (`kubectl apply -k manifests/overlays/simulated-node-dra`: the shipped
DaemonSet, RBAC and DeviceClasses on a simulated a100-80gb-x8-mixed node), talking to the API
server with its own service account. Checked through the API (ResourceSlices as the API server
serves them, claims as the scheduler allocated them, pods as the kubelet ran them), the
containers' own device nodes, and the driver's files on the host (CDI specs, checkpoint).
The driver is also killed inside Prepare and Unprepare (`DP_FAILPOINT` set on its DaemonSet)
and the kubelet's retries checked once it is removed. Scenarios run in file order; the Xid comes
last.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from deviceplugin.dra.checkpoint import read_boot_id
from deviceplugin.dra.failpoints import (
    EXIT_STATUS,
    FAILPOINT_ENV,
    PREPARE_AFTER_CDI_SPEC,
    PREPARE_AFTER_CHECKPOINT,
    UNPREPARE_AFTER_CDI_SPEC_REMOVED,
)
from deviceplugin.sim.node import read_node, resolve_node_path
from e2e.cluster.kube import (
    EVENTS,
    NODE_NAME,
    REPO,
    SIMULATED_NODE,
    KubectlError,
    Obj,
    append_event,
    apply,
    cluster,
    daemon_pod,
    daemon_ready,
    exec_in,
    get,
    kubectl,
    pod,
    pod_running,
    replace_daemon_pod,
    unschedulable_reason,
    wait_until,
    workload_pod,
)
from e2e.cluster.served import observed, served
from e2e.runtime import LIST_NODES, device_nodes, expected_nodes

NODE = read_node(resolve_node_path("a100-80gb-x8-mixed"))
DRIVER_ROOT = SIMULATED_NODE / "root"
OVERLAY = REPO / "manifests" / "overlays" / "simulated-node-dra"
DRIVER = "gpu.nvidia.com"
DRIVER_LABEL = "app.kubernetes.io/name=deviceplugin-dra"
DAEMONSET = "daemonset/deviceplugin-dra"
SYSTEM = ("-n", "kube-system")
CDI_DIR = Path("/var/run/cdi")
CHECKPOINT = Path("/var/lib/kubelet/plugins") / DRIVER / "checkpoint.json"
SEED_CLASS = "mig-1g.10gb.nvidia.com"

# The seed's own objects, as the seed wrote them: resource.k8s.io/v1beta1.
SEED_DEVICE_CLASS: Obj = {
    "apiVersion": "resource.k8s.io/v1beta1",
    "kind": "DeviceClass",
    "metadata": {"name": SEED_CLASS},
    "spec": {
        "selectors": [
            {
                "cel": {
                    "expression": "device.attributes['nvidia.com'].migProfile == '1g.10gb' && "
                    "device.attributes['nvidia.com'].healthy == true"
                }
            }
        ]
    },
}
SEED_TEMPLATE: Obj = {
    "apiVersion": "resource.k8s.io/v1beta1",
    "kind": "ResourceClaimTemplate",
    "metadata": {"name": "mig-slice", "namespace": "default"},
    "spec": {
        "spec": {
            "devices": {"requests": [{"name": "slice", "deviceClassName": SEED_CLASS, "count": 1}]}
        }
    },
}
PAIR_TEMPLATE: Obj = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaimTemplate",
    "metadata": {"name": "mig-pair", "namespace": "default"},
    "spec": {
        "spec": {
            "devices": {
                "requests": [
                    {"name": "pair", "exactly": {"deviceClassName": SEED_CLASS, "count": 2}}
                ],
                "constraints": [{"matchAttribute": "nvidia.com/parentUUID"}],
            }
        }
    },
}


def claim_pod(name: str, template: str, labels: dict[str, str] | None = None) -> Obj:
    """The seed's `digital-human-render` shape: one container holding a claim from a template,
    with the workload image swapped for the local busybox."""
    manifest = workload_pod(name, {})
    manifest["metadata"]["labels"] = {"e2e": "dra-workload", **(labels or {})}
    spec = manifest["spec"]
    spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": template}]
    spec["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    return manifest


def driver_pod() -> Obj:
    return daemon_pod(DRIVER_LABEL)


def driver_ready() -> str | None:
    return daemon_ready(DRIVER_LABEL)


def driver_status() -> Obj:
    """The driver's /status, through the API server's proxy to its pod."""
    found = driver_pod()["metadata"]
    where = f"/api/v1/namespaces/{found['namespace']}/pods/{found['name']}:8080/proxy/status"
    status: Obj = json.loads(kubectl("get", "--raw", where))
    return status


def driver_says_gate_off(gate: str) -> bool:
    """The driver's pod answers /status, not ready for `gate` (so it stays while it is off)."""
    try:
        return any(gate in why for why in driver_status()["not_ready"])
    except (KubectlError, KeyError, ValueError, subprocess.SubprocessError):
        return False


def slices() -> list[Obj]:
    items: list[Obj] = get("resourceslices", f"--field-selector=spec.driver={DRIVER}")["items"]
    return items


def published() -> dict[str, Obj]:
    """Every published device by name, from the current generation of the node's pool."""
    return newest_devices(slices())


def newest_devices(found: list[Obj]) -> dict[str, Obj]:
    """The devices of the newest pool generation among `found` slices (at least one), by name."""
    return {d["name"]: d for s in newest_generation(found) for d in s["spec"].get("devices") or []}


def newest_generation(found: list[Obj]) -> list[Obj]:
    newest = max(s["spec"]["pool"]["generation"] for s in found)
    return [s for s in found if s["spec"]["pool"]["generation"] == newest]


def complete_pool(found: list[Obj]) -> dict[str, Obj] | None:
    """The devices of `found`'s newest generation once all its slices are there (as many as the
    pool says it has); None before."""
    if not found:
        return None
    current = newest_generation(found)
    if len(current) != current[0]["spec"]["pool"]["resourceSliceCount"]:
        return None
    return newest_devices(current)


def claim_template(name: str, device_class: str, selector: str | None = None) -> Obj:
    """A claim template for one device of `device_class`, matching `selector` (CEL) if given."""
    request: Obj = {"name": "gpu", "exactly": {"deviceClassName": device_class}}
    if selector:
        request["exactly"]["selectors"] = [{"cel": {"expression": selector}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }


def attribute(device: Obj, name: str) -> object:
    value: Obj = device["attributes"][name]
    return next(iter(value.values()))


def allocated(pod_name: str) -> list[Obj]:
    """The allocation results of the pod's claim, as the scheduler wrote them."""
    statuses = pod(pod_name)["status"].get("resourceClaimStatuses", [])
    claim = get("resourceclaim", statuses[0]["resourceClaimName"], "-n", "default")
    results: list[Obj] = claim["status"]["allocation"]["devices"]["results"]
    return results


def claim_uid(pod_name: str, namespace: str = "default") -> str:
    statuses = pod(pod_name, namespace)["status"]["resourceClaimStatuses"]
    claim = get("resourceclaim", statuses[0]["resourceClaimName"], "-n", namespace)
    return str(claim["metadata"]["uid"])


def seen(name: str) -> dict[str, tuple[int, int]]:
    return device_nodes(exec_in(name, "sh", "-c", LIST_NODES))


def expected_for(results: list[Obj]) -> dict[str, tuple[int, int]]:
    devices = published()
    nodes: dict[str, tuple[int, int]] = {}
    for result in results:
        uuid = str(attribute(devices[result["device"]], "uuid"))
        nodes.update(expected_nodes(DRIVER_ROOT, NODE, uuid))
    return nodes


def prepared_in_checkpoint() -> set[str]:
    if not CHECKPOINT.exists():
        return set()
    return set(json.loads(CHECKPOINT.read_text())["data"]["claims"])


def cdi_spec_of(uid: str) -> Path:
    return CDI_DIR / f"k8s.{DRIVER}-claim_{uid}.json"


def delete_and_wait_unprepared(uid: str, what: str) -> None:
    """Delete the workloads, then wait until the claim `uid` is unprepared on the host: its CDI
    spec gone and the checkpoint no longer holding it."""
    delete_dra_workloads()
    wait_until(what, lambda: not cdi_spec_of(uid).exists())
    assert uid not in prepared_in_checkpoint()


def start(manifest: Obj) -> str:
    apply(manifest)
    name = str(manifest["metadata"]["name"])
    namespace = str(manifest["metadata"].get("namespace", "default"))
    try:
        wait_until(f"pod {name} Running", lambda: pod_running(name, namespace), timeout=180)
    except AssertionError as exc:  # say why: the pod's events, the claims and the slices
        raise AssertionError(f"{exc}\n{_scheduling_state(name, namespace)}") from None
    return name


def _scheduling_state(name: str, namespace: str) -> str:
    """What the cluster says about a pod that did not start, for the failure message."""
    parts = [
        kubectl("describe", "pod", name, "-n", namespace, check=False),
        kubectl("get", "resourceclaims", "-n", namespace, "-o", "wide", check=False),
        kubectl("get", "resourceslices", "-o", "wide", check=False),
    ]
    return "\n".join(part.strip() for part in parts)


def delete_dra_workloads() -> None:
    kubectl(
        "delete", "pod", "-n", "default", "-l", "e2e=dra-workload", "--wait=true", "--timeout=120s"
    )


@pytest.fixture(scope="module", autouse=True)
def dra_driver() -> Iterator[None]:
    EVENTS.write_text("")
    kubectl("apply", "-k", str(OVERLAY))
    wait_until("the driver pod Ready", driver_ready, timeout=240)
    wait_until("the node's slices", lambda: len(published()) == 32, timeout=120)
    apply(SEED_DEVICE_CLASS)
    apply(SEED_TEMPLATE)
    apply(PAIR_TEMPLATE)
    yield
    delete_dra_workloads()
    kubectl("delete", "-k", str(OVERLAY), "--wait=true", "--timeout=120s", check=False)
    EVENTS.write_text("")


@pytest.fixture(autouse=True)
def no_workloads_left() -> Iterator[None]:
    yield
    delete_dra_workloads()


def test_slices_describe_every_gpu_and_mig_device_as_v1() -> None:
    assert {s["apiVersion"] for s in slices()} == {"resource.k8s.io/v1"}
    devices = {str(attribute(d, "uuid")): d for d in published().values()}
    for gpu in NODE.gpus:
        if not gpu.mig_enabled:
            device = devices[gpu.uuid]
            assert attribute(device, "type") == "gpu"
            assert attribute(device, "nvidia.com/healthy") is True
            continue
        assert gpu.uuid not in devices  # a MIG-enabled GPU is its MIG devices
        for mig in gpu.mig_devices:
            device = devices[mig.uuid]
            assert attribute(device, "nvidia.com/migProfile") == mig.profile
            assert attribute(device, "nvidia.com/parentUUID") == gpu.uuid
            assert attribute(device, "nvidia.com/healthy") is True
            assert device["capacity"]["memory"]["value"]
    assert len(devices) == 32


def whole_pool() -> dict[str, Obj] | None:
    """Every device of the node's pool by name, once every slice of its newest generation is
    published; None before."""
    return complete_pool(slices())


def test_slices_do_not_follow_the_device_plugins_mig_strategy() -> None:
    """An adopted reload lists the slices afresh and repairs them, and nothing else repairs a
    slice deleted under the driver; so once the deleted pool is whole again, what is published
    is the reload's work, and it must be what was published before."""
    configmap = (REPO / "manifests" / "config" / "configmap.yaml").read_text()
    before = whole_pool()
    assert before is not None and len(before) == 32
    kubectl("delete", "resourceslices", f"--field-selector=spec.driver={DRIVER}", "--wait=true")
    try:
        kubectl(
            "apply", "-f", "-", stdin=configmap.replace("migStrategy: mixed", "migStrategy: none")
        )
        # Through the kubelet's volume swap to the driver's reload, which republishes.
        after = wait_until("the reload republishing the pool", whole_pool, timeout=180)
        assert after == before
    finally:
        kubectl("apply", "-f", "-", stdin=configmap)


def test_with_the_device_plugin_on_the_node_the_driver_publishes_nothing() -> None:
    name = start(claim_pod("held-across", "mig-slice"))
    devices = seen(name)
    plugin = REPO / "manifests" / "overlays" / "simulated-node"
    kubectl("apply", "-k", str(plugin))
    try:
        wait_until("the device plugin's GPUs", lambda: extended_gpus() == 8, timeout=240)
        wait_until("the driver's pool empty", lambda: published() == {}, timeout=60)
        reasons = wait_until("the driver saying why", driver_not_ready_reason, timeout=60)
        assert "nvidia-gpu.sock" in reasons
        assert seen(name) == devices  # a claim prepared before keeps its devices
    finally:
        kubectl("delete", "-k", str(plugin), "--wait=true", "--timeout=120s")
        apply_driver_config()
    wait_until("the driver's devices back", lambda: len(published()) == 32, timeout=120)


def extended_gpus() -> int:
    return int(get("node", NODE_NAME)["status"]["allocatable"].get("nvidia.com/gpu", "0"))


def driver_not_ready_reason() -> str | None:
    """The driver's error log line, once its pod is no longer Ready."""
    found = driver_pod()
    statuses = found["status"].get("containerStatuses", [])
    if not statuses or statuses[0]["ready"]:
        return None
    logs = kubectl("logs", *SYSTEM, found["metadata"]["name"]).splitlines()
    return next((line for line in logs if "dra.device_plugin.conflict" in line), None)


def apply_driver_config() -> None:
    """The device plugin's overlay shares the driver's ConfigMap: deleting it took that too."""
    kubectl("apply", "-k", str(REPO / "manifests" / "config"))


def test_seed_claim_template_gets_a_mig_device_the_container_sees() -> None:
    name = start(claim_pod("digital-human-render", "mig-slice"))
    results = allocated(name)
    assert len(results) == 1 and results[0]["driver"] == DRIVER
    device = published()[results[0]["device"]]
    assert attribute(device, "nvidia.com/migProfile") == "1g.10gb"
    assert seen(name) == expected_for(results)
    uid = claim_uid(name)
    assert cdi_spec_of(uid).exists()
    assert uid in prepared_in_checkpoint()


def test_a_pair_claim_gets_two_devices_of_one_gpu_ten_times() -> None:
    for attempt in range(10):
        name = start(claim_pod(f"pair-{attempt}", "mig-pair"))
        results = allocated(name)
        parents = {attribute(published()[r["device"]], "nvidia.com/parentUUID") for r in results}
        assert len(results) == 2 and len(parents) == 1, results
        assert seen(name) == expected_for(results)
        delete_dra_workloads()


def test_deleting_the_pod_unprepares_its_claim() -> None:
    name = start(claim_pod("short-lived", "mig-slice"))
    uid = claim_uid(name)
    assert cdi_spec_of(uid).exists() and uid in prepared_in_checkpoint()
    delete_and_wait_unprepared(uid, "the claim's CDI spec removed")


def test_driver_pod_deleted_keeps_prepared_claims_and_unprepares_later() -> None:
    name = start(claim_pod("outlives-driver", "mig-slice"))
    uid, devices = claim_uid(name), seen(name)
    replace_daemon_pod(DRIVER_LABEL)
    assert uid in prepared_in_checkpoint() and cdi_spec_of(uid).exists()
    assert seen(name) == devices
    delete_and_wait_unprepared(uid, "the claim unprepared by the new driver")


def test_kubelet_restart_re_registers_and_keeps_prepared_claims() -> None:
    name = start(claim_pod("outlives-kubelet", "mig-slice"))
    uid, devices = claim_uid(name), seen(name)
    cluster("restart", "kubelet")
    wait_until("its devices through the new kubelet", lambda: seen(name) == devices)
    assert uid in prepared_in_checkpoint()
    # Registered again: the restarted kubelet prepares a new claim through the driver.
    fresh = start(claim_pod("after-restart", "mig-slice"))
    assert seen(fresh) == expected_for(allocated(fresh))
    assert pod(name)["status"]["containerStatuses"][0]["restartCount"] == 0


def test_slices_deleted_behind_the_drivers_back_are_put_back_by_its_watch() -> None:
    """The kubelet's start-up wipe runs in the background and is retried, so it can land after
    the driver registered with the new kubelet; an operator may delete slices by hand too. The
    driver's watch puts the pool back, without waiting for a registration."""
    before = published()
    restarts = driver_pod()["status"]["containerStatuses"][0]["restartCount"]
    selector = f"--field-selector=spec.nodeName={NODE_NAME},spec.driver={DRIVER}"
    kubectl("delete", "resourceslices", selector)
    wait_until("the pool put back", lambda: slices() and published().keys() == before.keys())
    logs = kubectl("logs", *SYSTEM, driver_pod()["metadata"]["name"])
    assert "dra.slices.repair" in logs
    assert driver_pod()["status"]["containerStatuses"][0]["restartCount"] == restarts
    fresh = start(claim_pod("after-wipe", "mig-slice"))
    assert seen(fresh) == expected_for(allocated(fresh))


def set_driver_env(assignment: str) -> None:
    """`kubectl set env` on the driver's DaemonSet (`NAME=value`, or `NAME-` to remove it), and
    wait for the rollout: the old pod gone, the new one Ready."""
    kubectl("set", "env", *SYSTEM, DAEMONSET, assignment)
    kubectl("rollout", "status", *SYSTEM, DAEMONSET, "--timeout=300s", timeout=320)
    wait_until("one driver pod, Ready", lambda: len(driver_pods()) == 1 and driver_ready())


def driver_pods() -> list[Obj]:
    items: list[Obj] = get("pods", *SYSTEM, "-l", DRIVER_LABEL)["items"]
    return items


def driver_died_at_failpoint() -> bool:
    """The driver's container last ended with the failpoints' exit status."""
    (found,) = driver_pods()
    statuses = found["status"].get("containerStatuses", [])
    ended = statuses[0].get("lastState", {}).get("terminated", {}) if statuses else {}
    return bool(ended.get("exitCode") == EXIT_STATUS)


def files_of(uid: str) -> list[Path]:
    """Whatever the driver left on the host under the claim's UID: specs, temp files."""
    return [p for p in CDI_DIR.iterdir() if uid in p.name]


def checkpoint_data() -> Obj:
    data: Obj = json.loads(CHECKPOINT.read_text())["data"]
    return data


@pytest.mark.parametrize("point", [PREPARE_AFTER_CDI_SPEC, PREPARE_AFTER_CHECKPOINT])
def test_a_driver_killed_in_prepare_prepares_the_claim_once_the_failpoint_is_gone(
    point: str,
) -> None:
    name = f"through-{point}"
    set_driver_env(f"{FAILPOINT_ENV}={point}")
    try:
        apply(claim_pod(name, "mig-slice"))
        wait_until(f"the driver exiting at {point}", driver_died_at_failpoint, timeout=180)
    finally:
        set_driver_env(f"{FAILPOINT_ENV}-")
    wait_until(f"pod {name} Running through the kubelet's retry", lambda: pod_running(name), 300)
    results = allocated(name)
    assert seen(name) == expected_for(results)  # exactly its device
    uid = claim_uid(name)
    saved = checkpoint_data()
    assert saved["bootID"] == read_boot_id()  # this boot's
    entry = saved["claims"][uid]
    assert entry["state"] == "PrepareCompleted"
    assert sorted(d["device"] for d in entry["devices"]) == sorted(r["device"] for r in results)
    assert files_of(uid) == [cdi_spec_of(uid)]
    delete_and_wait_unprepared(uid, "the claim unprepared")
    assert files_of(uid) == []


def test_a_driver_killed_in_unprepare_finishes_it_once_the_failpoint_is_gone() -> None:
    set_driver_env(f"{FAILPOINT_ENV}={UNPREPARE_AFTER_CDI_SPEC_REMOVED}")
    try:
        name = start(claim_pod("through-unprepare", "mig-slice"))
        assert seen(name) == expected_for(allocated(name))
        uid = claim_uid(name)
        kubectl("delete", "pod", "-n", "default", name, "--wait=false")
        wait_until("the driver exiting in Unprepare", driver_died_at_failpoint, timeout=180)
        assert files_of(uid) == [] and uid in prepared_in_checkpoint()
    finally:
        set_driver_env(f"{FAILPOINT_ENV}-")
    wait_until(
        "the claim unprepared by the kubelet's retry",
        lambda: uid not in prepared_in_checkpoint(),
        timeout=300,
    )
    assert files_of(uid) == []
    assert checkpoint_data()["bootID"] == read_boot_id()


def test_xid_79_unpublishes_a_gpus_devices_for_new_claims_only() -> None:
    running = start(claim_pod("before-xid", "mig-slice"))
    devices = seen(running)
    (held,) = allocated(running)
    parent = attribute(published()[held["device"]], "nvidia.com/parentUUID")
    failing = next(gpu for gpu in NODE.gpus if gpu.uuid == parent)  # the running pod's GPU
    own = {mig.uuid for mig in failing.mig_devices}
    started = time.monotonic()
    append_event({"uuid": failing.uuid, "xid": 79})
    tainted = served("DRADeviceTaints")

    def unhealthy() -> bool:
        flags = [
            attribute(d, "nvidia.com/healthy")
            for d in published().values()
            if attribute(d, "uuid") in own
        ]
        if not tainted:  # no taint would survive: the devices leave the slice instead
            return flags == []
        return len(flags) == len(own) and not any(flags)

    wait_until("the GPU's devices published unhealthy (or, untainted, gone)", unhealthy, timeout=30)
    assert time.monotonic() - started <= 5, "published unhealthy later than 5 s after the Xid"
    if not tainted:
        features = driver_status()["server_features"]
        assert features["known"] and not features["taints"], features

    for n in range(3):
        name = start(claim_pod(f"after-xid-{n}", "mig-slice"))
        got = {attribute(published()[r["device"]], "uuid") for r in allocated(name)}
        assert not got & own, got

    on_failing_gpu = f"device.attributes['nvidia.com'].parentUUID == '{failing.uuid}'"
    request = {
        "name": "slice",
        "exactly": {
            "deviceClassName": "mig.nvidia.com",
            "selectors": [{"cel": {"expression": on_failing_gpu}}],
        },
    }
    only_failing: Obj = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "only-failing", "namespace": "default"},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }
    apply(only_failing)
    apply(claim_pod("needs-failing-gpu", "only-failing"))
    reason = wait_until(
        "needs-failing-gpu Pending with the scheduler's reason",
        lambda: unschedulable_reason("needs-failing-gpu"),
        timeout=60,
    )
    # The DRA plugin's Filter: no device of the claim's class and selector is free of the taint.
    assert "cannot allocate all claims" in reason, reason
    assert pod("needs-failing-gpu")["status"]["phase"] == "Pending", reason
    status = pod(running)["status"]
    assert status["phase"] == "Running" and status["containerStatuses"][0]["restartCount"] == 0
    assert seen(running) == devices
    if tainted:
        observed("DRADeviceTaints", "kept: an unhealthy device is published tainted")
    else:
        observed(
            "DRADeviceTaints", "dropped: an unhealthy device leaves the slice (probe found it)"
        )
    used = driver_status()["kubelet_api"]
    assert "v1.DRAPlugin" in used, used
    observed("kubelet DRA API", ", ".join(sorted(used)))
    if not served("ResourceHealthStatus"):
        # the kubelet opens no health stream, so the pod status has no device health
        assert not any(name.endswith("DRAResourceHealth") for name in used), used
        assert "allocatedResourcesStatus" not in pod(running)["status"]["containerStatuses"][0]
        observed("ResourceHealthStatus", "off: no health stream, no device health in pod status")
        return
    # The kubelet heard it from the driver's health stream (KEP-4680) and says so in the pod,
    # naming the device by the CDI ID Prepare returned for it.
    resource_id = f"k8s.{DRIVER}/claim={claim_uid(running)}-{held['device']}"
    health = wait_until(
        "the pod's allocatedResourcesStatus naming the device Unhealthy",
        lambda: next(
            (
                resource["health"]
                for entry in pod(running)["status"]["containerStatuses"][0].get(
                    "allocatedResourcesStatus", []
                )
                for resource in entry.get("resources", [])
                if resource["resourceID"] == resource_id and resource["health"] == "Unhealthy"
            ),
            None,
        ),
        timeout=120,
    )
    assert health == "Unhealthy"
    observed("ResourceHealthStatus", "on: the pod status names the device Unhealthy")
