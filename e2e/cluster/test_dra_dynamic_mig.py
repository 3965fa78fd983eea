"""Dynamic MIG under the real scheduler and kubelet (`make e2e-cluster`): partitions chosen by
the scheduler through the shared counters, cut at Prepare, removed at Unprepare.

Deployed as a user would: `kubectl apply -k manifests/overlays/simulated-node-dra-dynamic-mig`,
the same DaemonSet as test_dra.py's (so it takes the static driver's place for this file and is
deleted at its end) on the node's own driver root, `dynamic-root` (8 x A100 80GB, MIG mode on,
no instance), so the static scenarios' root is never touched. Claims tie their requests to one
GPU with `matchAttribute` on `gpu.nvidia.com/parentUUID`; which combinations the scheduler
allocates is NVIDIA's documented placements, checked here by whether pods run or stay Pending
with the scheduler's reason. What was cut is read from the host with nvidia-ml-py on the root's
library (`simlibrary.py`): exactly the running claims' instances, none once they are gone. Each
container sees exactly its partitions' device nodes, computed from the instance ids the library
reports and the driver's mig-minors formula.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from deviceplugin.dra.failpoints import (
    FAILPOINT_ENV,
    PREPARE_AFTER_COMPUTE_INSTANCE,
    PREPARE_AFTER_GPU_INSTANCE,
)
from deviceplugin.sim.hostroot import EVENTS_FILE
from e2e.cluster.kube import (
    EVENTS,
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
from e2e.cluster.simlibrary import mig_instances
from e2e.cluster.test_dra import (
    DRIVER,
    DRIVER_LABEL,
    allocated,
    attribute,
    checkpoint_data,
    claim_pod,
    claim_uid,
    delete_dra_workloads,
    driver_died_at_failpoint,
    driver_ready,
    driver_says_gate_off,
    driver_status,
    published,
    set_driver_env,
    start,
)
from e2e.runtime import CAPS_MAJOR, CONTROL_NODES, LIST_NODES, NVIDIA_MAJOR, device_nodes, host_node

DYNAMIC_ROOT = SIMULATED_NODE / "dynamic-root"
OVERLAY = REPO / "manifests" / "overlays" / "simulated-node-dra-dynamic-mig"
GATE = "DRAPartitionableDevices"  # the counters dynamic MIG publishes need it (on from 1.36)
GPUS, PARTITIONS_PER_GPU = 8, 25  # a100-80gb-x8-dynamic: each A100 whole and 25 placements
SAME_GPU = {"matchAttribute": f"{DRIVER}/parentUUID"}
NO_ROOM = "cannot allocate all claims"  # the DRA plugin's Filter, in the pod's condition


def request(name: str, profile: str, count: int = 1, where: str = "") -> Obj:
    """`count` partitions of `profile` (class mig.nvidia.com), and `where` (CEL) if given."""
    expression = f"device.attributes['{DRIVER}'].profile == '{profile}'"
    if where:
        expression += f" && {where}"
    selectors = [{"cel": {"expression": expression}}]
    return {
        "name": name,
        "exactly": {"deviceClassName": "mig.nvidia.com", "selectors": selectors, "count": count},
    }


def template(name: str, requests: list[Obj], constraints: list[Obj] | None = None) -> str:
    """Apply a ResourceClaimTemplate of `requests` (and `constraints`); its name."""
    devices: Obj = {"requests": requests}
    if constraints:
        devices["constraints"] = constraints
    apply(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"spec": {"devices": devices}},
        }
    )
    return name


def on_gpu(uuid: str) -> str:
    return f"device.attributes['{DRIVER}'].parentUUID == '{uuid}'"


def whole_gpu(uuid: str) -> Obj:
    selector = {"cel": {"expression": f"device.attributes['{DRIVER}'].uuid == '{uuid}'"}}
    return {
        "name": "whole",
        "exactly": {"deviceClassName": "gpu.nvidia.com", "selectors": [selector]},
    }


def pending(name: str) -> str:
    """Apply nothing; wait for pod `name` to be left Pending by the scheduler, and say why."""
    reason = wait_until(
        f"{name} Pending with the scheduler's reason",
        lambda: unschedulable_reason(name),
        timeout=90,
    )
    assert NO_ROOM in reason, reason
    assert pod(name)["status"]["phase"] == "Pending", reason
    return reason


def placement(device: Obj) -> tuple[str, int, int, int]:
    """(parent UUID, profile id, start, size) of a published partition; the profile id is the
    second-last field of NVIDIA's name, `gpu-<minor>-mig-<profile>-<profileId>-<start>`."""
    profile_id = int(device["name"].rsplit("-", 2)[1])
    return (
        str(device["attributes"]["parentUUID"]["string"]),
        profile_id,
        int(device["attributes"]["placementStart"]["int"]),
        int(device["attributes"]["placementSize"]["int"]),
    )


def placements_of(pod_names: list[str]) -> list[tuple[str, int, int, int]]:
    """The placements the scheduler chose for the pods' claims, partitions only."""
    devices = published()
    found = []
    for name in pod_names:
        for result in allocated(name):
            device = devices[result["device"]]
            if attribute(device, "type") == "mig":
                found.append(placement(device))
    return sorted(found)


def held() -> list[tuple[str, int, int, int]]:
    """The GPU instances the simulated library holds, each with its compute instance."""
    instances = mig_instances(DYNAMIC_ROOT)
    assert all(i["ci"] is not None for i in instances), instances  # no GPU instance alone
    return sorted((i["gpu"], i["profile"], i["start"], i["size"]) for i in instances)


def seen(name: str) -> dict[str, tuple[int, int]]:
    return device_nodes(exec_in(name, "sh", "-c", LIST_NODES))


def expected_nodes(name: str) -> dict[str, tuple[int, int]]:
    """The device nodes pod `name` must see: the control nodes, and for each of its claim's
    devices the GPU's node, plus for a partition the access nodes of the GPU and compute
    instance the library holds at its placement (mig-minors: 3 + 135·gpu + 9·gi, + 1 + ci)."""
    nodes = {path: host_node(DYNAMIC_ROOT / path.lstrip("/")) for path in CONTROL_NODES}
    by_placement = {
        (i["gpu"], i["profile"], i["start"], i["size"]): i for i in mig_instances(DYNAMIC_ROOT)
    }
    minors = {str(g["uuid"]): int(g["minor"]) for g in _gpus()}
    devices = published()
    for result in allocated(name):
        device = devices[result["device"]]
        if attribute(device, "type") == "gpu":
            minor = minors[str(attribute(device, "uuid"))]
            nodes[f"/dev/nvidia{minor}"] = (NVIDIA_MAJOR, minor)
            continue
        instance = by_placement[placement(device)]
        gi = 3 + 135 * instance["minor"] + 9 * instance["gi"]
        ci = gi + 1 + instance["ci"]
        nodes[f"/dev/nvidia{instance['minor']}"] = (NVIDIA_MAJOR, instance["minor"])
        nodes[f"/dev/nvidia-caps/nvidia-cap{gi}"] = (CAPS_MAJOR, gi)
        nodes[f"/dev/nvidia-caps/nvidia-cap{ci}"] = (CAPS_MAJOR, ci)
    return nodes


def _gpus() -> list[dict[str, Any]]:
    """The whole GPUs published, with their UUID and minor."""
    return [
        {"uuid": attribute(d, "uuid"), "minor": d["attributes"]["minor"]["int"]}
        for d in published().values()
        if attribute(d, "type") == "gpu"
    ]


def gpu_of(name: str) -> str:
    """The one parent GPU of pod `name`'s partitions."""
    (parent,) = {p[0] for p in placements_of([name])}
    return parent


def running_exactly(names: list[str]) -> None:
    """The library holds exactly the pods' partitions, and each pod sees exactly its own."""
    assert held() == placements_of(names)
    for name in names:
        assert seen(name) == expected_nodes(name), name


def gone() -> None:
    """Every workload deleted, and (once unprepared) no instance left in the library."""
    delete_dra_workloads()
    wait_until("no MIG instance left in the library", lambda: held() == [], timeout=120)


def needs_counters() -> None:
    """The scenarios below need the partitions' counters; where the cluster's gates drop them,
    test_without_counters_only_whole_gpus_are_published asserts what the driver does instead."""
    if not served(GATE):
        pytest.skip(f"{GATE} off on Kubernetes {version()}: the degraded scenario runs instead")


@pytest.fixture(scope="module", autouse=True)
def dynamic_driver() -> Iterator[None]:
    EVENTS.write_text("")
    kubectl("apply", "-k", str(OVERLAY))
    if served(GATE):
        wait_until("the dynamic driver pod Ready", driver_ready, timeout=240)
        expected = GPUS * (1 + PARTITIONS_PER_GPU)
    else:
        wait_until(
            f"the dynamic driver naming {GATE}", lambda: driver_says_gate_off(GATE), timeout=240
        )
        expected = GPUS
    wait_until("the dynamic node's slices", lambda: len(published()) == expected, timeout=120)
    yield
    delete_dra_workloads()
    kubectl("delete", "-k", str(OVERLAY), "--wait=true", "--timeout=120s", check=False)


@pytest.fixture(autouse=True)
def nothing_left() -> Iterator[None]:
    assert held() == []
    yield
    gone()


def test_every_gpu_is_published_whole_and_as_its_placements_with_counters() -> None:
    needs_counters()
    found = get("resourceslices", f"--field-selector=spec.driver={DRIVER}")["items"]
    sets = [s for f in found for s in (f["spec"].get("sharedCounters") or [])]
    assert sorted(s["name"] for s in sets) == [f"gpu-{m}-counter-set" for m in range(GPUS)]
    devices = published().values()
    partitions = [d for d in devices if attribute(d, "type") == "mig"]
    assert len(partitions) == GPUS * PARTITIONS_PER_GPU
    assert all("uuid" not in d["attributes"] for d in partitions)  # nothing cut yet
    assert all(d["consumesCounters"] for d in devices)
    observed(GATE, f"kept: {len(partitions)} partitions with {len(sets)} counter sets")


def test_seven_1g10gb_fit_on_one_gpu_and_an_eighth_there_does_not() -> None:
    needs_counters()
    seven = template("seven-1g", [request("slices", "1g.10gb", 7)], [SAME_GPU])
    name = start(claim_pod("seven-1g", seven))
    parent = gpu_of(name)
    assert [p[2] for p in placements_of([name])] == list(range(7))
    running_exactly([name])
    eighth = template("eighth-1g", [request("slice", "1g.10gb", where=on_gpu(parent))])
    apply(claim_pod("eighth-1g", eighth))
    pending("eighth-1g")
    eight = template("eight-1g", [request("slices", "1g.10gb", 8)], [SAME_GPU])
    apply(claim_pod("eight-1g", eight))
    pending("eight-1g")  # on no GPU at all
    running_exactly([name])


def test_3g40gb_and_four_1g10gb_fit_on_one_gpu_two_3g40gb_and_a_1g10gb_do_not() -> None:
    needs_counters()
    mix = template(
        "three-and-four", [request("big", "3g.40gb"), request("small", "1g.10gb", 4)], [SAME_GPU]
    )
    name = start(claim_pod("three-and-four", mix))
    chosen = placements_of([name])
    assert len({p[0] for p in chosen}) == 1, chosen
    running_exactly([name])
    over = template(
        "three-three-one",
        [request("big", "3g.40gb", 2), request("small", "1g.10gb")],
        [SAME_GPU],
    )
    apply(claim_pod("three-three-one", over))
    pending("three-three-one")
    running_exactly([name])


def test_a_whole_gpu_and_a_partition_of_it_never_run_together() -> None:
    needs_counters()
    gpu = str(next(g["uuid"] for g in _gpus() if g["minor"] == GPUS - 1))
    whole = template("whole-gpu", [whole_gpu(gpu)])
    part = template("part-of-gpu", [request("slice", "1g.10gb", where=on_gpu(gpu))])
    first = start(claim_pod("whole-first", whole))
    assert seen(first) == expected_nodes(first)
    assert held() == []  # the whole GPU cuts nothing
    apply(claim_pod("part-after", part))
    pending("part-after")
    kubectl("delete", "pod", "-n", "default", first, "--wait=true")
    wait_until("the partition running once the GPU is free", lambda: pod_running("part-after"), 180)
    running_exactly(["part-after"])
    apply(claim_pod("whole-after", whole))
    pending("whole-after")
    other = str(next(g["uuid"] for g in _gpus() if g["minor"] == GPUS - 2))  # a free GPU
    both = template(  # nvidia.com/parentUUID: a whole GPU names itself, so only counters refuse
        "whole-and-part",
        [whole_gpu(other), request("slice", "1g.10gb")],
        [{"matchAttribute": "nvidia.com/parentUUID"}],
    )
    apply(claim_pod("whole-and-part", both))
    pending("whole-and-part")
    running_exactly(["part-after"])


@pytest.mark.parametrize("point", [PREPARE_AFTER_GPU_INSTANCE, PREPARE_AFTER_COMPUTE_INSTANCE])
def test_a_driver_killed_while_cutting_prepares_the_claim_once_with_no_orphan(point: str) -> None:
    needs_counters()
    name = f"cut-{point}"
    one = template("one-3g", [request("slice", "3g.40gb")])
    set_driver_env(f"{FAILPOINT_ENV}={point}")
    try:
        apply(claim_pod(name, one))
        wait_until(f"the driver exiting at {point}", driver_died_at_failpoint, timeout=180)
    finally:
        set_driver_env(f"{FAILPOINT_ENV}-")
    wait_until(f"pod {name} Running through the kubelet's retry", lambda: pod_running(name), 300)
    running_exactly([name])  # one instance: what the dead driver cut was destroyed at start
    entry = checkpoint_data()["claims"][claim_uid(name)]
    assert entry["state"] == "PrepareCompleted"
    (device,) = entry["devices"]
    (instance,) = mig_instances(DYNAMIC_ROOT)
    assert device["migPartition"]["uuid"] == instance["uuid"]


def test_an_xid_takes_a_gpus_whole_device_and_every_partition_out() -> None:
    needs_counters()
    """Last: the GPU stays unhealthy for the rest of the driver's life."""
    gpu = str(next(g["uuid"] for g in _gpus() if g["minor"] == 0))
    events = DYNAMIC_ROOT / EVENTS_FILE
    with open(events, "a") as stream:
        stream.write(f'{{"uuid": "{gpu}", "xid": 79}}\n')

    def out() -> bool:
        own = [  # nvidia.com/parentUUID: the whole GPU names itself
            d
            for d in published().values()
            if d["attributes"]["nvidia.com/parentUUID"]["string"] == gpu
        ]
        return len(own) == 1 + PARTITIONS_PER_GPU and not any(
            attribute(d, "nvidia.com/healthy") for d in own
        )

    wait_until("the GPU and its partitions published unhealthy", out, timeout=60)
    part = template("part-of-sick", [request("slice", "1g.10gb", where=on_gpu(gpu))])
    apply(claim_pod("part-of-sick", part))
    pending("part-of-sick")


def test_without_counters_only_whole_gpus_are_published() -> None:
    """Where the API server drops counters (1.34, 1.35 by default), `--mig-mode dynamic`
    publishes no partition, so nothing the scheduler could hand out twice; it says why in its
    /status, its readiness and one error line naming the gate, and a whole GPU still serves."""
    if served(GATE):
        pytest.skip(f"{GATE} on: the scenarios above run")
    found = get("resourceslices", f"--field-selector=spec.driver={DRIVER}")["items"]
    assert [s for f in found for s in (f["spec"].get("sharedCounters") or [])] == []
    devices = published().values()
    assert len(devices) == GPUS
    assert {attribute(d, "type") for d in devices} == {"gpu"}
    assert not any(d.get("consumesCounters") for d in devices)
    status = driver_status()
    assert status["server_features"]["known"] and not status["server_features"]["counters"]
    assert [why for why in status["not_ready"] if GATE in why], status["not_ready"]
    lines = kubectl("logs", "-n", "kube-system", "-l", DRIVER_LABEL, "--tail=-1").splitlines()
    named = [line for line in lines if "dra.server.gate_off" in line and GATE in line]
    assert named and all('"level":"error"' in line for line in named), named
    # a partition claim waits; a whole GPU runs; nothing was cut
    apply(claim_pod("partition-waits", template("one-1g", [request("slice", "1g.10gb")])))
    reason = wait_until(
        "partition-waits Pending with the scheduler's reason",
        lambda: unschedulable_reason("partition-waits"),
        timeout=90,
    )
    assert pod("partition-waits")["status"]["phase"] == "Pending", reason
    whole = template(
        "one-whole", [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]
    )
    name = start(claim_pod("whole-runs", whole))
    assert [attribute(published()[r["device"]], "type") for r in allocated(name)] == ["gpu"]
    assert held() == []
    observed(GATE, "dropped: whole GPUs only, no partition; the driver names the gate")
