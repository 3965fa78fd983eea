"""NVIDIA's DRA driver (gpu-kubelet-plugin v0.4.1, unmodified) and ours, one at a time, on the
same real node and simulated driver root (docs/compatibility.md, "DRA"): the ResourceSlices
each publishes, what the seed's DeviceClass and NVIDIA's classes select on each, and whether a
claim of each is allocated, prepared and seen by its container.

NVIDIA's plugin runs as a host process against the real kubelet and API server (in a private
mount namespace that shows it the driver root's /proc/driver and /proc/devices,
testbed/plugins.py), not as a DaemonSet: it is the same binary and the same kubelet and
API calls, without its Helm chart.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import pytest

from e2e.cluster.kube import (
    KUBECONFIG,
    NODE_NAME,
    REPO,
    RUN,
    SIMULATED_NODE,
    Obj,
    apply,
    get,
    kubectl,
    pod_running,
    unschedulable_reason,
    wait_until,
)
from e2e.cluster.test_dra import (
    DRIVER,
    OVERLAY,
    SEED_DEVICE_CLASS,
    SEED_TEMPLATE,
    claim_pod,
    driver_ready,
    published,
    seen,
)
from testbed import plugins

DRIVER_ROOT = SIMULATED_NODE / "root"
CLASSES = REPO / "manifests" / "dra" / "deviceclasses.yaml"
SNAPSHOT = RUN / "reference-dra.json"
DEVICES = 32  # a100-80gb-x8-mixed: 4 whole GPUs and 28 MIG devices
T = TypeVar("T")


def template(name: str, device_class: str) -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "one", "exactly": {"deviceClassName": device_class, "count": 1}}
                    ]
                }
            }
        },
    }


# pod name -> the claim template it uses
CLAIMS = {"any-gpu": "reference-gpu", "any-mig": "reference-mig", "seed": "mig-slice"}


@dataclass
class Driven:
    """What one driver did on the node."""

    devices: dict[str, Obj] = field(default_factory=dict)
    running: dict[str, bool] = field(default_factory=dict)
    nodes: dict[str, list[str]] = field(default_factory=dict)  # device nodes each pod saw
    unschedulable: dict[str, str] = field(default_factory=dict)


def _drive() -> Driven:
    driven = Driven(devices=published())
    for name, claim_template in CLAIMS.items():
        apply(claim_pod(name, claim_template))
    for name in CLAIMS:

        def settled(name: str = name) -> bool | None:
            return pod_running(name) or bool(unschedulable_reason(name)) or None

        wait_until(f"pod {name} Running or unschedulable", settled, timeout=120)
        driven.running[name] = pod_running(name)
        if driven.running[name]:
            driven.nodes[name] = sorted(seen(name))
        else:
            driven.unschedulable[name] = unschedulable_reason(name) or ""
    kubectl("delete", "pod", "-n", "default", "-l", "e2e=dra-workload", "--wait=true")
    return driven


def no_slices() -> bool | None:
    items = get("resourceslices", f"--field-selector=spec.driver={DRIVER}")["items"]
    return not items or None


def nvidia_binaries() -> Path:
    """NVIDIA's binaries (build.sh), or the test skipped saying why there are none."""
    try:
        return plugins.reference_binaries()
    except plugins.ReferenceUnavailable as exc:
        pytest.skip(str(exc))


def with_ours(drive: Callable[[], T]) -> T:
    """`drive` run with our driver deployed (the DRA overlay) in NVIDIA's place, once its
    slices are complete; the overlay removed after."""
    kubectl("delete", "resourceslices", f"--field-selector=spec.driver={DRIVER}", check=False)
    kubectl("apply", "-k", str(OVERLAY))
    try:
        wait_until("our driver Ready", driver_ready, timeout=240)
        wait_until("our slices", lambda: len(published()) == DEVICES or None, timeout=120)
        return drive()
    finally:
        kubectl("delete", "-k", str(OVERLAY), "--wait=true", "--timeout=120s", check=False)


@pytest.fixture(scope="module")
def drivers() -> Iterator[dict[str, Driven]]:
    binaries = nvidia_binaries()
    kubectl("apply", "-f", str(CLASSES))
    apply(SEED_DEVICE_CLASS)
    apply(SEED_TEMPLATE)
    apply(template("reference-gpu", "gpu.nvidia.com"))
    apply(template("reference-mig", "mig.nvidia.com"))
    driven: dict[str, Driven] = {}
    wait_until("no slices of another driver", no_slices, timeout=120)
    plugins.hand_over_dra_checkpoint()
    log = RUN / "logs" / "nvidia-dra-driver.log"
    driver = plugins.dra_driver(
        binaries, DRIVER_ROOT, KUBECONFIG, NODE_NAME, Path("/var/run/cdi"), log
    )
    with driver.start():
        wait_until("NVIDIA's slices", lambda: len(published()) == DEVICES or None, timeout=120)
        driven["nvidia"] = _drive()
    driven["ours"] = with_ours(_drive)
    SNAPSHOT.write_text(json.dumps({k: v.__dict__ for k, v in driven.items()}, indent=1) + "\n")
    yield driven


def _by_uuid(devices: dict[str, Obj]) -> dict[str, Obj]:
    return {str(device["attributes"]["uuid"]["string"]): device for device in devices.values()}


def test_both_publish_the_same_devices(drivers: dict[str, Driven]) -> None:
    nvidia, ours = _by_uuid(drivers["nvidia"].devices), _by_uuid(drivers["ours"].devices)
    assert set(nvidia) == set(ours) and len(ours) == DEVICES
    # Whole GPUs have the same names; MIG devices are named by each driver its own way.
    for uuid, device in nvidia.items():
        if uuid.startswith("GPU-"):
            assert device["name"] == ours[uuid]["name"]


# NVIDIA's attributes that ours publishes too, with the same values (docs/compatibility.md).
SHARED_ATTRIBUTES = (
    "architecture",
    "cudaComputeCapability",
    "cudaDriverVersion",
    "driverVersion",
    "productName",
    "type",
    "uuid",
    "resource.kubernetes.io/pciBusID",
)


def test_nvidias_attributes_have_the_same_values_in_ours(drivers: dict[str, Driven]) -> None:
    nvidia, ours = _by_uuid(drivers["nvidia"].devices), _by_uuid(drivers["ours"].devices)
    for uuid, device in nvidia.items():
        theirs, mine = device["attributes"], ours[uuid]["attributes"]
        for name in SHARED_ATTRIBUTES:
            assert mine[name] == theirs[name], (uuid, name)
        if theirs["type"] == {"string": "mig"}:
            assert (
                mine["profile"] == theirs["profile"] and mine["parentUUID"] == theirs["parentUUID"]
            )
        assert ours[uuid]["capacity"]["memory"] == device["capacity"]["memory"], uuid
        # Only NVIDIA's: `brand`, and the MIG engine counts as capacities.
        assert set(theirs) - set(mine) <= {"brand"}


def test_nvidias_classes_get_a_device_from_either_driver(drivers: dict[str, Driven]) -> None:
    for name in ("nvidia", "ours"):
        driven = drivers[name]
        assert driven.running["any-gpu"] and driven.running["any-mig"], (name, driven)
        assert any(node.startswith("/dev/nvidia-caps/") for node in driven.nodes["any-mig"])
        assert any(node[len("/dev/nvidia") :].isdigit() for node in driven.nodes["any-gpu"])


def test_the_seed_class_needs_the_seed_attributes(drivers: dict[str, Driven]) -> None:
    """The seed's class reads `nvidia.com/migProfile` and `nvidia.com/healthy`, which only ours
    publishes: on NVIDIA's slices its CEL fails with a runtime error and nothing is allocated."""
    assert drivers["ours"].running["seed"]
    assert not drivers["nvidia"].running["seed"]
    assert "no such key" in drivers["nvidia"].unschedulable["seed"]
