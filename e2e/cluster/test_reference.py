"""NVIDIA's reference device plugin v0.19.0 and ours, one DaemonSet at a time, on the same real
node (the simulated a100-80gb-x8-mixed driver root) with the same config file (`migStrategy:
none`): each must make the node's GPUs allocatable, run a GPU pod and take a GPU away on Xid 79.
The time each step takes is printed and kept in run/reference-compared.json, as figures for
docs/performance.md, never asserted: the medians of ROUNDS rounds, the two plugins taking turns,
since the kubelet publishes allocatable on its node-status period and one sample says little.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Iterator

import pytest
import yaml

from deviceplugin.sim.node import read_node, resolve_node_path
from e2e.cluster.kube import (
    EVENTS,
    REPO,
    RUN,
    append_event,
    apply,
    daemon_ready,
    delete_workloads,
    extended,
    kubectl,
    pod_running,
    wait_until,
    workload_pod,
)

GPU = "nvidia.com/gpu"
NODE = read_node(resolve_node_path("a100-80gb-x8-mixed"))
GPUS = len(NODE.gpus)  # migStrategy none: every GPU whole, MIG mode or not
REFERENCE = REPO / "e2e" / "reference" / "daemonset.yaml"
OURS = REPO / "manifests" / "overlays" / "simulated-node"
COMPARED_CONFIG = yaml.safe_load(REFERENCE.read_text().split("---")[0])["data"]["config.yaml"]
FIGURES = RUN / "reference-compared.json"
ROUNDS = 3


def ours_manifests() -> str:
    """The overlay as a user applies it, its ConfigMap holding the compared config."""
    documents = list(yaml.safe_load_all(kubectl("kustomize", str(OURS))))
    for document in documents:
        if (
            document["kind"] == "ConfigMap"
            and document["metadata"]["name"] == "deviceplugin-config"
        ):
            document["data"]["config.yaml"] = COMPARED_CONFIG
    return yaml.safe_dump_all(documents)


def deploy_reference() -> None:
    kubectl("apply", "-f", str(REFERENCE))


def remove_reference() -> None:
    kubectl("delete", "-f", str(REFERENCE), "--wait=true", "--timeout=120s", check=False)


def deploy_ours() -> None:
    apply(ours_manifests())


def remove_ours() -> None:
    kubectl(
        "delete", "-f", "-", "--wait=true", "--timeout=120s", stdin=ours_manifests(), check=False
    )


PLUGINS: dict[str, tuple[Callable[[], None], Callable[[], None], str]] = {
    "reference": (
        deploy_reference,
        remove_reference,
        "app.kubernetes.io/name=nvidia-device-plugin",
    ),
    "ours": (deploy_ours, remove_ours, "app.kubernetes.io/name=deviceplugin"),
}


def _seconds_until(what: str, probe: Callable[[], bool], timeout: float = 180) -> float:
    began = time.monotonic()
    wait_until(what, lambda: True if probe() else None, timeout=timeout)
    return time.monotonic() - began


def measure(name: str) -> dict[str, float]:
    deploy, remove, label = PLUGINS[name]
    wait_until("no GPU allocatable before", lambda: extended(GPU) == 0 or None, timeout=180)
    began = time.monotonic()
    deploy()
    try:
        wait_until(f"{name}: allocatable", lambda: extended(GPU) == GPUS or None, timeout=240)
        figures = {"deploy -> node allocatable (s)": time.monotonic() - began}
        wait_until(f"{name}: pod Ready", lambda: daemon_ready(label), timeout=60)
        apply(workload_pod(f"{name}-gpu", {GPU: "1"}))
        figures["GPU pod created -> Running (s)"] = _seconds_until(
            f"{name}: pod Running", lambda: pod_running(f"{name}-gpu")
        )
        append_event({"uuid": NODE.gpus[-1].uuid, "xid": 79})
        figures["Xid 79 -> allocatable drop (s)"] = _seconds_until(
            f"{name}: allocatable {GPUS - 1}", lambda: extended(GPU) == GPUS - 1
        )
        return figures
    finally:
        delete_workloads()
        remove()
        # The kubelet drops the resource once the plugin's socket is gone: the next starts clean.
        wait_until("allocatable gone", lambda: extended(GPU) == 0 or None, timeout=180)


@pytest.fixture(autouse=True)
def clean_events() -> Iterator[None]:
    yield
    EVENTS.write_text("")  # the Xid's GPU is healthy again for whoever comes next


def test_each_plugin_serves_the_node_alone_and_the_figures_are_kept() -> None:
    samples: dict[str, dict[str, list[float]]] = {name: {} for name in PLUGINS}
    for _ in range(ROUNDS):
        for name in PLUGINS:
            for measure_name, value in measure(name).items():
                samples[name].setdefault(measure_name, []).append(value)
    figures = {name: {m: statistics.median(v) for m, v in s.items()} for name, s in samples.items()}
    FIGURES.write_text(json.dumps({"median": figures, "samples": samples}, indent=1) + "\n")
    for measure_name in figures["ours"]:
        ours, reference = figures["ours"][measure_name], figures["reference"][measure_name]
        print(f"{measure_name}, median of {ROUNDS}: ours {ours:.2f}, reference {reference:.2f}")
