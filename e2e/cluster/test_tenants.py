"""Claim authors are tenants (`make e2e-cluster`): pods of two namespaces, `tenant-a` and
`tenant-b`, made here and deleted afterwards, on one GPU of the real node.

The driver is deployed with memory shares on (`manifests/overlays/simulated-node-dra-shares`),
and every claim is pinned to one whole 80 GiB GPU of the simulated node by its UUID, with the
builders of test_dra_shares.py. What the driver refuses at Prepare is read where the kubelet
reports it: the pod's `FailedPrepareDynamicResources` events. Checked:

- a claim whose opaque MPS config holds a hostile quantity (an exponent that took seconds to
  build, one that overflowed `decimal`) fails its own pod with the field's path, while an
  ordinary claim of the other namespace on the same GPU runs;
- one GPU's MPS daemon serves one namespace: the other namespace's MPS claim is refused naming
  the namespace it serves, two claims of one namespace share one daemon (pipe and pid), and
  once that namespace's claims are gone the other's claim gets a daemon of its own in a fresh
  home, with nothing of the first namespace's shared memory;
- four pods each holding a 20 GiB share ask the simulated library in the container for GPU
  index 0 and get the GPU they hold, capped at 20 GiB, and no other GPU.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime

import pytest

from e2e.cluster.kube import (
    RUN,
    Obj,
    apply,
    exec_in,
    get,
    kubectl,
    pod,
    pod_running,
    wait_until,
)
from e2e.cluster.served import served
from e2e.cluster.test_dra import cdi_spec_of, claim_uid, driver_ready, start
from e2e.cluster.test_dra_shares import (
    GATE,
    GIB,
    GPU,
    MPS_HOMES,
    OVERLAY,
    daemons_on,
    mps_seen,
    namespace_pid,
    needs_capacity,
    pinned_device,
    result_of,
    share_pod,
    template,
)

TENANT_A, TENANT_B = "tenant-a", "tenant-b"
TENANTS = (TENANT_A, TENANT_B)
LABEL = "tenants"
MPS = {"defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "10Gi"}
# Quantities no claim should be able to make the driver build: 10^999999 took seconds on the
# driver's event loop, 10^999999999999 raised decimal.Overflow and failed the whole batch.
HOSTILE = {"exponent": "1e999999", "overflow": "1e999999999999"}
HOSTILE_FIELD = "opaque.parameters.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit"
# What a process in the container gets for GPU index 0, as a CUDA program asks by default.
INDEX_0 = (
    "import json, pynvml; pynvml.nvmlInit(); handle = pynvml.nvmlDeviceGetHandleByIndex(0); "
    "uuid = pynvml.nvmlDeviceGetUUID(handle); "
    "print(json.dumps({'count': pynvml.nvmlDeviceGetCount(), "
    "'uuid': uuid.decode() if isinstance(uuid, bytes) else uuid, "
    "'total': pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2).total}))"
)
# How long the other tenant's ordinary pod took, from creation to Ready (recorded, not asserted).
MEASURED = RUN / "tenants.json"
SHM_FILE = "tenant-a-secret"  # written in /dev/shm by a tenant-a container


def tenant_pod(name: str, claim_template: str, namespace: str) -> Obj:
    return share_pod(name, claim_template, LABEL, namespace)


def prepare_failures(name: str, namespace: str) -> list[str]:
    """What the kubelet reported of the driver's refusals to prepare the pod's claim."""
    selector = f"involvedObject.name={name},reason=FailedPrepareDynamicResources"
    events = get("events", "-n", namespace, f"--field-selector={selector}")["items"]
    return [str(event["message"]) for event in events]


def refused(name: str, namespace: str) -> str:
    """The pod's first Prepare refusal, once there is one; the pod does not run meanwhile."""
    (message, *_) = wait_until(
        f"{namespace}/{name} refused at Prepare", lambda: prepare_failures(name, namespace)
    )
    assert not pod_running(name, namespace), message
    return message


def shm_of(name: str, namespace: str) -> list[str]:
    """What the pod's container lists in its /dev/shm."""
    listing = "import json, os; print(json.dumps(os.listdir('/dev/shm')))"
    names: list[str] = json.loads(exec_in(name, "python", "-c", listing, namespace=namespace))
    return names


def seconds_to_ready(name: str, namespace: str) -> float:
    """From the pod's creation to its Ready condition, as the API server stamped them."""
    found = pod(name, namespace)
    (ready,) = (c for c in found["status"]["conditions"] if c["type"] == "Ready")
    created = datetime.fromisoformat(found["metadata"]["creationTimestamp"])
    return (datetime.fromisoformat(ready["lastTransitionTime"]) - created).total_seconds()


def clear(namespace: str) -> None:
    """Delete the namespace's pods and wait until their claims are unprepared on the host."""
    uids = [c["metadata"]["uid"] for c in get("resourceclaims", "-n", namespace)["items"]]
    kubectl("delete", "pod", "--all", "-n", namespace, "--wait=true", "--timeout=120s")
    wait_until(
        f"the claims of {namespace} unprepared",
        lambda: not any(cdi_spec_of(uid).exists() for uid in uids),
    )


def namespace(name: str) -> Obj:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


@pytest.fixture(scope="module", autouse=True)
def tenants() -> Iterator[None]:
    if not served(GATE):  # every scenario here is about shares: each skips, naming the gate
        yield
        return
    kubectl("apply", "-k", str(OVERLAY))
    wait_until("the driver pod Ready", driver_ready, timeout=240)
    wait_until(
        "the GPU published shareable", lambda: pinned_device().get("allowMultipleAllocations")
    )
    for name in TENANTS:
        kubectl("delete", "namespace", name, "--ignore-not-found", "--wait=true", "--timeout=180s")
        apply(namespace(name))
        apply(template("share-20gi", "20Gi", namespace=name))
        apply(template("mps", "20Gi", MPS, namespace=name))
    for kind, value in HOSTILE.items():
        hostile = {"defaultPinnedDeviceMemoryLimit": value}
        apply(template(f"hostile-{kind}", "20Gi", hostile, namespace=TENANT_A))
    yield
    for name in TENANTS:
        clear(name)
        kubectl("delete", "namespace", name, "--wait=true", "--timeout=180s", check=False)
    kubectl("delete", "-k", str(OVERLAY), "--wait=true", "--timeout=120s", check=False)


@pytest.fixture(autouse=True)
def no_pods_left() -> Iterator[None]:
    yield
    for name in TENANTS:
        clear(name)


def test_a_hostile_mps_quantity_fails_its_own_pod_and_another_tenants_claim_runs() -> None:
    needs_capacity()
    for kind in HOSTILE:
        apply(tenant_pod(f"hostile-{kind}", f"hostile-{kind}", TENANT_A))
    for kind, value in HOSTILE.items():
        message = refused(f"hostile-{kind}", TENANT_A)
        assert HOSTILE_FIELD in message, message
        assert f"'{value}' is out of range" in message, message
    # the hostile claims keep failing at each retry of the kubelet; the other tenant's ordinary
    # claim on the same GPU is prepared all the same
    ordinary = start(tenant_pod("ordinary", "share-20gi", TENANT_B))
    assert result_of(ordinary, TENANT_B)["device"] == pinned_device()["name"]
    measured = {"ordinarySecondsToReady": seconds_to_ready(ordinary, TENANT_B)}
    MEASURED.write_text(json.dumps(measured) + "\n")
    for kind in HOSTILE:
        assert not pod_running(f"hostile-{kind}", TENANT_A)
        assert pod(f"hostile-{kind}", TENANT_A)["status"]["phase"] == "Pending"


def test_one_gpus_mps_daemon_serves_one_namespace() -> None:
    needs_capacity()
    device = pinned_device()["name"]
    pipe = MPS_HOMES / device / "pipe"
    first = start(tenant_pod("mps-1", "mps", TENANT_A))
    write = f"open('/dev/shm/{SHM_FILE}', 'w').write('a')"
    exec_in(first, "python", "-c", write, namespace=TENANT_A)

    apply(tenant_pod("mps-other", "mps", TENANT_B))
    message = refused("mps-other", TENANT_B)
    assert f"{device} runs an MPS daemon for namespace {TENANT_A}" in message, message
    assert f"a claim of namespace {TENANT_B} may not share it" in message, message

    # one namespace's claims still share the device's one daemon
    second = start(tenant_pod("mps-2", "mps", TENANT_A))
    assert result_of(first, TENANT_A)["device"] == result_of(second, TENANT_A)["device"] == device
    seen = [mps_seen(name, TENANT_A) for name in (first, second)]
    (daemon,) = daemons_on(pipe)
    assert seen[0]["socket"] and seen[1]["socket"], seen
    assert seen[0]["pid"] == seen[1]["pid"] == str(namespace_pid(daemon)), seen
    assert SHM_FILE in shm_of(second, TENANT_A)

    # once tenant-a's claims are gone, the kubelet's next retry gives tenant-b a daemon of its
    # own, in a fresh home: nothing of tenant-a's shared memory
    clear(TENANT_A)
    wait_until("mps-other Running", lambda: pod_running("mps-other", TENANT_B), timeout=180)
    (fresh,) = daemons_on(pipe)
    assert fresh != daemon
    assert mps_seen("mps-other", TENANT_B)["pid"] == str(namespace_pid(fresh))
    assert SHM_FILE not in shm_of("mps-other", TENANT_B)
    uid = claim_uid("mps-other", TENANT_B)
    clear(TENANT_B)
    assert not cdi_spec_of(uid).exists()
    wait_until("the daemon gone after the last Unprepare", lambda: not daemons_on(pipe))
    assert not (MPS_HOMES / device).exists()


def test_each_shares_container_sees_the_gpu_it_holds_at_index_0_capped() -> None:
    needs_capacity()
    pods = [(f"share-{n}", TENANTS[n % 2]) for n in range(4)]
    for name, tenant in pods:
        start(tenant_pod(name, "share-20gi", tenant))
    assert {result_of(name, tenant)["device"] for name, tenant in pods} == {pinned_device()["name"]}
    assert GPU.index != 0  # the node's GPU 0 is another GPU: the container must not see it
    for name, tenant in pods:
        seen = json.loads(exec_in(name, "python", "-c", INDEX_0, namespace=tenant))
        assert seen == {"count": 1, "uuid": GPU.uuid, "total": 20 * GIB}, (name, seen)
