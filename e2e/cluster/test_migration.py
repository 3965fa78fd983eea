"""A node moved between the device plugin and DRA by its label, with pods running, no drain
(docs/dra/migrating.md, "Migrating a node from the device plugin"), on the real kubelet,
scheduler and API server (`make e2e-cluster`).

Deployed by the kustomize route: each simulated-node overlay with the patch of
manifests/overlays/dra-label (the device plugin, ours or NVIDIA's, where `nvidia.com/dra` is not
`true`; the DRA driver where the label is set, `true` or `false`), the extended-resource
DeviceClasses applied, so unchanged `limits: nvidia.com/gpu: 1` pods are served through DRA once
the node is labelled `true`, and by the device plugin again once it is labelled `false`. Checked
through the workloads themselves: the GPU each container was given (its device nodes, or
NVIDIA_VISIBLE_DEVICES for NVIDIA's plugin), the published devices, the Node's allocatable. No
GPU may be held by two pods at any time. The seconds from a holder's end to its GPU's next pod
are kept in run/migration.json as figures, not asserted. Scenarios run in file order.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from deviceplugin.sim.node import read_node, resolve_node_path
from e2e.cluster.kube import (
    NODE_NAME,
    REPO,
    RUN,
    Obj,
    apply,
    cluster,
    daemon_ready,
    delete_workloads,
    exec_in,
    extended,
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
from e2e.cluster.test_device_plugin import gpu_minor, seen
from e2e.cluster.test_dra import DRIVER_LABEL, claim_pod, claim_template, published

GPU, MIG = "nvidia.com/gpu", "nvidia.com/mig-1g.10gb"
LABEL = "nvidia.com/dra"
NODE = read_node(resolve_node_path("a100-80gb-x8-mixed"))
MINOR_OF = {gpu.uuid: gpu.minor for gpu in NODE.gpus}
WHOLE = [gpu for gpu in NODE.gpus if not gpu.mig_enabled]
ALL_DEVICES = 32  # as DRA publishes a100-80gb-x8-mixed: 4 whole GPUs, 28 MIG devices
PLUGIN_OVERLAY = REPO / "manifests" / "overlays" / "simulated-node"
DRA_OVERLAY = REPO / "manifests" / "overlays" / "simulated-node-dra"
EXTENDED_CLASSES = REPO / "manifests" / "dra" / "deviceclasses-extended-resources.yaml"
REFERENCE = REPO / "e2e" / "reference" / "daemonset.yaml"
PLUGIN_LABEL = "app.kubernetes.io/name=deviceplugin"
REFERENCE_LABEL = "app.kubernetes.io/name=nvidia-device-plugin"
FIGURES = RUN / "migration.json"
PATCHES = REPO / "manifests" / "overlays" / "dra-label"
PLUGIN_PATCH = PATCHES / "deviceplugin" / "off-dra-nodes.yaml"
DRA_PATCH = PATCHES / "dra" / "on-dra-nodes.yaml"


def exclusive(manifests: str, patch: Path) -> str:
    """`manifests` with every DaemonSet given the node affinity of `patch` (a shipped patch of
    manifests/overlays/dra-label, whose DaemonSets have no affinity of their own)."""
    affinity = yaml.safe_load(patch.read_text())["spec"]["template"]["spec"]["affinity"]
    documents = [d for d in yaml.safe_load_all(manifests) if d]
    for document in documents:
        if document["kind"] == "DaemonSet":
            spec = document["spec"]["template"]["spec"]
            assert "affinity" not in spec
            spec["affinity"] = affinity
    return yaml.safe_dump_all(documents)


def ours(plugin: bool) -> str:
    """Our device plugin's or DRA driver's simulated-node overlay, patched."""
    path, patch = (PLUGIN_OVERLAY, PLUGIN_PATCH) if plugin else (DRA_OVERLAY, DRA_PATCH)
    return exclusive(kubectl("kustomize", str(path)), patch)


def reference() -> str:
    return exclusive(REFERENCE.read_text(), PLUGIN_PATCH)


def label(value: str | None) -> None:
    """The node's `nvidia.com/dra`: "true" (DRA), "false" (moved back), None (never moved)."""
    kubectl("label", "node", NODE_NAME, f"{LABEL}={value}" if value else f"{LABEL}-", "--overwrite")


def no_pods(label: str) -> bool:
    return not get("pods", "-n", "kube-system", "-l", label)["items"]


def gpu_of(name: str) -> int:
    """The minor of the whole GPU the pod's container was given (its device nodes)."""
    return gpu_minor(seen(name))


def visible_gpu(name: str) -> int:
    """The minor of the GPU NVIDIA's plugin gave the pod (its NVIDIA_VISIBLE_DEVICES UUID)."""
    uuid = exec_in(name, "sh", "-c", "echo $NVIDIA_VISIBLE_DEVICES").strip()
    return MINOR_OF[uuid]


# Where a scenario's pod goes to a node on DRA: with DRAExtendedResource (on from 1.36) the
# unchanged `limits` pod is served by a claim the scheduler makes; without it that pod cannot run
# there, so the scenario checks it waits and asks the same device by a claim of the class the
# extended resource maps to (one template per resource, made by the `classes` fixture).
CLAIM_TEMPLATES = {
    GPU: ("migration-whole-gpu", "gpu.nvidia.com"),
    MIG: ("migration-mig-1g", "mig-1g.10gb.nvidia.com"),
}


def start(name: str, limits: dict[str, str], on_dra: bool = False) -> None:
    """A pod asking `limits`: as written, or on a DRA node of a cluster without
    DRAExtendedResource, once the unchanged pod was seen waiting, by a claim instead."""
    if not on_dra or served("DRAExtendedResource"):
        apply(workload_pod(name, limits))
        return
    unchanged = workload_pod(f"{name}-unchanged", limits)
    apply(unchanged)
    reason = wait_until(
        f"{name}-unchanged unschedulable", lambda: unschedulable_reason(f"{name}-unchanged")
    )
    assert "Insufficient" in reason, reason
    kubectl("delete", "pod", "-n", "default", f"{name}-unchanged", "--wait=true")
    ((resource, _),) = limits.items()
    apply(claim_pod(name, CLAIM_TEMPLATES[resource][0], {"e2e": "workload"}))


def settle(names: list[str]) -> tuple[list[str], list[str]]:
    """(running, unschedulable) once every pod is one or the other."""

    def settled() -> tuple[list[str], list[str]] | None:
        running = [n for n in names if pod_running(n)]
        waiting = [n for n in names if n not in running and unschedulable_reason(n)]
        return (running, waiting) if len(running) + len(waiting) == len(names) else None

    try:
        return wait_until(f"pods {names} Running or unschedulable", settled, timeout=180)
    except AssertionError as err:
        phases = {n: pod(n)["status"].get("phase") for n in names}
        raise AssertionError(f"{err}; phases {phases}") from None


def end(name: str) -> float:
    """Delete the pod and wait until it is gone; the monotonic time it was."""
    kubectl("delete", "pod", "-n", "default", name, "--wait=true", "--timeout=120s")
    return time.monotonic()


def record(figure: str, seconds: float) -> None:
    figures = json.loads(FIGURES.read_text()) if FIGURES.exists() else {}
    figures[figure] = round(seconds, 1)
    FIGURES.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"{figure}: {seconds:.1f} s")


def dra_devices() -> dict[str, Obj]:
    return published()


def on_gpu(devices: dict[str, Obj], minor: int) -> list[str]:
    """The published devices that live on the GPU with `minor` (it, or MIG devices of it)."""
    uuid = next(gpu.uuid for gpu in NODE.gpus if gpu.minor == minor)
    return [
        name
        for name, device in devices.items()
        if device["attributes"]["nvidia.com/parentUUID"]["string"] == uuid
    ]


def on_gpu_all(minor: int) -> list[str]:
    """Every device DRA would publish on the GPU with `minor`: the GPU, or its MIG devices."""
    gpu = next(g for g in NODE.gpus if g.minor == minor)
    return [m.uuid for m in gpu.mig_devices] if gpu.mig_enabled else [gpu.uuid]


def dra_serving(devices: int) -> bool:
    return bool(daemon_ready(DRIVER_LABEL)) and len(dra_devices()) == devices


@pytest.fixture(scope="module", autouse=True)
def classes() -> Iterator[None]:
    kubectl("apply", "-f", str(EXTENDED_CLASSES))
    for name, device_class in CLAIM_TEMPLATES.values():
        apply(claim_template(name, device_class))
    yield
    delete_workloads()
    for manifests in (ours(plugin=True), ours(plugin=False), reference()):
        kubectl("delete", "-f", "-", "--wait=true", "--timeout=120s", stdin=manifests, check=False)
    kubectl("delete", "-f", str(EXTENDED_CLASSES), "--wait=true", check=False)
    for name, _ in CLAIM_TEMPLATES.values():
        kubectl("delete", "resourceclaimtemplate", "-n", "default", name, check=False)
    label(None)


@pytest.fixture(autouse=True)
def no_workloads_left() -> Iterator[None]:
    yield
    delete_workloads()


def test_ours_to_dra_with_a_pod_running_hands_its_gpu_on_only_after_it_ends() -> None:
    label(None)
    wait_until(f"{GPU} allocatable 0 before", lambda: extended(GPU) == 0)  # no earlier plugin's
    apply(ours(plugin=True))
    apply(ours(plugin=False))
    wait_until("our plugin Ready", lambda: daemon_ready(PLUGIN_LABEL), timeout=240)
    wait_until(f"{GPU} allocatable 8", lambda: extended(GPU) == 8, timeout=240)
    assert no_pods(DRIVER_LABEL)  # a node never labelled has the device plugin alone
    start("holder", {GPU: "1"})
    wait_until("holder Running", lambda: pod_running("holder"))
    held = gpu_of("holder")

    label("true")
    wait_until("the device plugin gone", lambda: no_pods(PLUGIN_LABEL), timeout=120)
    wait_until(f"{GPU} allocatable 0", lambda: extended(GPU) == 0)  # else bound to the plugin
    wait_until("the DRA driver publishing 31 devices", lambda: dra_serving(31), timeout=240)
    assert on_gpu(dra_devices(), held) == []

    # A driver restart and a kubelet restart in the middle keep the GPU withheld.
    replace_daemon_pod(DRIVER_LABEL)
    wait_until("the restarted driver publishing 31 devices", lambda: dra_serving(31))
    cluster("restart", "kubelet")
    wait_until("31 devices after the kubelet restart", lambda: dra_serving(31), timeout=240)
    assert on_gpu(dra_devices(), held) == []
    # The restarted kubelet answers exec for the pod once it has synced it again.
    wait_until("holder's GPU through the new kubelet", lambda: gpu_of("holder") == held)
    assert pod_running("holder")

    names = [f"unchanged-{n}" for n in range(len(WHOLE))]
    for name in names:
        start(name, {GPU: "1"}, on_dra=True)
    running, waiting = settle(names)
    assert len(running) == len(WHOLE) - 1 and len(waiting) == 1, (running, waiting)
    given = [gpu_of(name) for name in running]
    assert held not in given and len(set(given)) == len(given), (held, given)
    start("mig", {MIG: "1"}, on_dra=True)
    wait_until("an unchanged MIG pod Running through DRA", lambda: pod_running("mig"))

    ended = end("holder")
    (last,) = waiting
    wait_until(f"{last} Running on the freed GPU", lambda: pod_running(last), timeout=120)
    record("ours_to_dra_freed_gpu_to_next_pod_seconds", time.monotonic() - ended)
    assert gpu_of(last) == held
    if served("DRAExtendedResource"):
        observed("DRAExtendedResource", "on: unchanged limits pods served through DRA")
    else:
        observed("DRAExtendedResource", "off: unchanged limits pods wait on a DRA node; claims run")


def test_dra_to_ours_with_a_claim_prepared_keeps_its_gpu_from_the_plugin() -> None:
    assert dra_serving(ALL_DEVICES) or wait_until("every device published", lambda: dra_serving(32))
    start("claimer", {GPU: "1"}, on_dra=True)  # through DRA: a claim the scheduler made
    wait_until("claimer Running", lambda: pod_running("claimer"))
    held = gpu_of("claimer")

    label("false")
    wait_until("our plugin Ready", lambda: daemon_ready(PLUGIN_LABEL), timeout=240)
    # The driver stays beside it, to unprepare the claim once its pod ends, publishing nothing.
    wait_until("the DRA driver publishing nothing", lambda: dra_serving(0), timeout=120)
    # 4 whole GPUs x 2 replicas (the seed config), less the claim's GPU
    wait_until(f"{GPU} allocatable 6", lambda: extended(GPU) == 6, timeout=240)
    replace_daemon_pod(PLUGIN_LABEL)  # a plugin restart in the middle keeps it out
    wait_until(f"{GPU} allocatable 6 after a plugin restart", lambda: extended(GPU) == 6)
    # The scheduler still counts the claimer's own `nvidia.com/gpu: 1` against the node: 5 fit
    # (6 where the claimer asked by a claim: nothing of the extended resource is counted).
    fit = 5 if served("DRAExtendedResource") else 6
    names = [f"back-{n}" for n in range(7)]
    for name in names:
        start(name, {GPU: "1"})
    running, waiting = settle(names)
    assert len(running) == fit and len(waiting) == 7 - fit, (running, waiting)
    assert held not in [gpu_of(name) for name in running]

    ended = end("claimer")
    for name in waiting:
        wait_until(f"{name} Running once the claim's GPU is free", lambda: pod_running(name))  # noqa: B023
    record("dra_to_ours_freed_gpu_to_next_pod_seconds", time.monotonic() - ended)
    given = [gpu_of(name) for name in names]
    assert all(given.count(minor) <= 2 for minor in given), given  # 2 replicas a GPU
    observed("PodResources for DRA", "the device plugin withholds a DRA claim's GPU")


def test_nvidias_plugin_to_our_dra_driver_with_a_pod_running() -> None:
    kubectl("delete", "-f", "-", "--wait=true", stdin=ours(plugin=True))
    wait_until("our plugin gone", lambda: no_pods(PLUGIN_LABEL), timeout=120)
    wait_until(f"{GPU} allocatable 0", lambda: extended(GPU) == 0)
    apply(reference())
    wait_until("NVIDIA's plugin Ready", lambda: daemon_ready(REFERENCE_LABEL), timeout=240)
    wait_until(f"{GPU} allocatable 8 from NVIDIA's plugin", lambda: extended(GPU) == 8)
    start("nvidia-holder", {GPU: "1"})
    wait_until("nvidia-holder Running", lambda: pod_running("nvidia-holder"))
    held = visible_gpu("nvidia-holder")

    label("true")
    wait_until("NVIDIA's plugin gone", lambda: no_pods(REFERENCE_LABEL), timeout=120)
    wait_until(f"{GPU} allocatable 0", lambda: extended(GPU) == 0)  # else bound to the plugin
    expected = ALL_DEVICES - len(on_gpu_all(held))
    wait_until(f"{expected} devices published", lambda: dra_serving(expected), timeout=240)
    assert on_gpu(dra_devices(), held) == []
    names = [f"after-nvidia-{n}" for n in range(len(WHOLE))]
    for name in names:
        start(name, {GPU: "1"}, on_dra=True)
    running, _ = settle(names)
    assert held not in [gpu_of(name) for name in running]
    assert pod_running("nvidia-holder") and visible_gpu("nvidia-holder") == held


def test_nvidias_plugin_to_our_plugin_with_a_pod_running() -> None:
    label("false")
    wait_until("NVIDIA's plugin serving", lambda: daemon_ready(REFERENCE_LABEL), timeout=240)
    wait_until(f"{GPU} allocatable 8 from NVIDIA's plugin", lambda: extended(GPU) == 8)
    start("nvidia-holder-2", {GPU: "1"})
    wait_until("nvidia-holder-2 Running", lambda: pod_running("nvidia-holder-2"))
    held = visible_gpu("nvidia-holder-2")

    kubectl("delete", "-f", "-", "--wait=true", stdin=reference())
    wait_until(f"{GPU} allocatable 0", lambda: extended(GPU) == 0)
    apply(ours(plugin=True))
    wait_until("our plugin Ready", lambda: daemon_ready(PLUGIN_LABEL), timeout=240)
    whole_held = any(gpu.minor == held for gpu in WHOLE)
    expected = 6 if whole_held else 8  # 4 whole GPUs x 2 replicas, less a held one's
    wait_until(f"{GPU} allocatable {expected}", lambda: extended(GPU) == expected, timeout=120)
    if not whole_held:  # a MIG GPU held whole: none of its MIG devices is offered
        gpu = next(g for g in NODE.gpus if g.minor == held)
        slices = 28 - sum(m.profile == "1g.10gb" for m in gpu.mig_devices)
        wait_until(f"{MIG} allocatable {slices}", lambda: extended(MIG) == slices)
    names = [f"ours-after-nvidia-{n}" for n in range(expected)]
    for name in names:
        start(name, {GPU: "1"})
    running, _ = settle(names)
    assert held not in [gpu_of(name) for name in running]
    assert pod_running("nvidia-holder-2") and visible_gpu("nvidia-holder-2") == held
