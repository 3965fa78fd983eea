"""The Helm chart under the real kubelet, scheduler and API server (`make e2e-cluster`).

Installed as an operator would (`helm install` of manifests/helm/deviceplugin with
e2e/cluster/values-simulated-node.yaml: two named configs, `dedicated` the default and `shared`
with two replicas per GPU, on the simulated a100-80gb-x8-mixed node), then checked only through
the API: the Node's allocatable, its labels and Events, and the plugin pod's identity and restart
count, which must not change from install to uninstall, whatever the label or the upgrade does.
Helm is the one e2e/helm/build.sh builds (cached). Scenarios run in file order.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from e2e.cluster.kube import (
    NODE_NAME,
    REPO,
    Obj,
    daemon_pod,
    daemon_ready,
    extended,
    get,
    helm,
    kubectl,
    wait_until,
)

GPU, MIG = "nvidia.com/gpu", "nvidia.com/mig-1g.10gb"
CONFIG_LABEL = "nvidia.com/device-plugin.config"
RELEASE = "gpu"
NAMESPACE = "kube-system"
CHART = REPO / "manifests" / "helm" / "deviceplugin"
VALUES = REPO / "e2e" / "cluster" / "values-simulated-node.yaml"
PLUGIN_LABEL = f"app.kubernetes.io/name=deviceplugin,app.kubernetes.io/instance={RELEASE}"
# The ConfigMap reaches the pod at the kubelet's next volume sync (about a minute by default).
CONFIGMAP_SYNC = 180
# A label change is a watch event away: seconds.
LABEL_SWITCH = 30


def label_node(value: str | None) -> None:
    change = f"{CONFIG_LABEL}-" if value is None else f"{CONFIG_LABEL}={value}"
    kubectl("label", "node", NODE_NAME, "--overwrite", change)


def node_labels() -> dict[str, str]:
    labels: dict[str, str] = get("node", NODE_NAME)["metadata"].get("labels", {})
    return labels


def plugin() -> Obj:
    return daemon_pod(PLUGIN_LABEL)


def identity() -> tuple[str, int]:
    """The plugin pod's UID and its container's restart count."""
    found = plugin()
    (status,) = found["status"]["containerStatuses"]
    return str(found["metadata"]["uid"]), int(status["restartCount"])


def config_events() -> list[Obj]:
    selector = f"involvedObject.kind=Node,involvedObject.name={NODE_NAME}"
    events: list[Obj] = get("events", "-n", "default", "--field-selector", selector)["items"]
    return [e for e in events if e.get("reason") == "DevicePluginConfigUnknown"]


def chart_objects() -> list[str]:
    """Every object carrying the release's instance label, of the kinds the chart makes."""
    kinds = "daemonsets,configmaps,serviceaccounts,roles,rolebindings,services,pods"
    selector = f"app.kubernetes.io/instance={RELEASE}"
    found = kubectl("get", kinds, "-A", "-l", selector, "-o", "name")
    cluster_kinds = (
        "clusterroles,clusterrolebindings,"
        "validatingadmissionpolicies,validatingadmissionpolicybindings"
    )
    cluster = kubectl("get", cluster_kinds, "-l", selector, "-o", "name")
    return [line for line in (found + cluster).splitlines() if line.strip()]


def with_config(dedicated_replicas: int) -> Path:
    """The values file with `dedicated` time-sliced `dedicated_replicas` ways."""
    values = yaml.safe_load(VALUES.read_text())
    values["config"]["map"]["dedicated"] = (
        "version: v1\nflags:\n  migStrategy: mixed\nsharing:\n  timeSlicing:\n    resources:\n"
        f"      - name: nvidia.com/gpu\n        replicas: {dedicated_replicas}\n"
    )
    path = Path(tempfile.mkdtemp(prefix="helm-values")) / "values.yaml"
    path.write_text(json.dumps(values))
    return path


@pytest.fixture(scope="module", autouse=True)
def release() -> Iterator[None]:
    label_node(None)
    helm("install", RELEASE, str(CHART), "--values", str(VALUES), "--wait", "--timeout", "240s")
    wait_until("the plugin pod Ready", lambda: daemon_ready(PLUGIN_LABEL), timeout=240)
    yield
    if RELEASE in helm("list", "--short").split():  # a scenario failed before uninstalling
        helm("uninstall", RELEASE, "--wait", "--timeout", "120s")
    label_node(None)


@pytest.fixture(scope="module")
def first_pod() -> tuple[str, int]:
    return identity()


@pytest.fixture
def same_pod(first_pod: tuple[str, int]) -> Iterator[None]:
    """The scenario leaves the plugin pod of the install in place, never restarted."""
    yield
    assert identity() == (first_pod[0], 0), "the plugin pod was replaced or restarted"


@pytest.mark.usefixtures("same_pod")
def test_install_serves_the_default_config() -> None:
    # dedicated: the 4 whole GPUs once each, the 28 MIG devices
    wait_until(f"{GPU} allocatable 4", lambda: extended(GPU) == 4, timeout=120)
    assert extended(MIG) == 28


@pytest.mark.usefixtures("same_pod")
def test_the_node_label_switches_the_config_in_place() -> None:
    label_node("shared")
    wait_until(f"{GPU} allocatable 8", lambda: extended(GPU) == 8, timeout=LABEL_SWITCH)
    label_node("dedicated")
    wait_until(f"{GPU} allocatable 4", lambda: extended(GPU) == 4, timeout=LABEL_SWITCH)
    label_node("shared")
    wait_until(f"{GPU} allocatable 8", lambda: extended(GPU) == 8, timeout=LABEL_SWITCH)


@pytest.mark.usefixtures("same_pod")
def test_an_unknown_name_keeps_the_last_good_config_with_an_event_on_the_node() -> None:
    label_node("no-such-config")
    events = wait_until("an Event on the Node", config_events, timeout=LABEL_SWITCH)
    assert "no-such-config" in events[0]["message"]
    assert events[0]["type"] == "Warning"
    assert extended(GPU) == 8  # still `shared`
    status = json.loads(
        kubectl(
            "exec",
            "-n",
            NAMESPACE,
            plugin()["metadata"]["name"],
            "--",
            "deviceplugin",
            "inspect",
            "--from",
            "http://127.0.0.1:8080",
            "-o",
            "json",
        )
    )
    assert "no-such-config" in status["config"]["selection"]["error"]
    label_node(None)  # the default again
    wait_until(f"{GPU} allocatable 4", lambda: extended(GPU) == 4, timeout=LABEL_SWITCH)


@pytest.mark.usefixtures("same_pod")
def test_the_node_carries_gpu_labels() -> None:
    def labelled() -> dict[str, str] | None:
        found = node_labels()
        return found if "nvidia.com/gpu.product" in found else None

    labels = wait_until("GPU labels on the Node", labelled, timeout=60)
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
    assert labels["nvidia.com/gpu.count"] == "8"
    assert labels["nvidia.com/gpu.memory"] == "81920"
    assert labels["nvidia.com/gpu.family"] == "ampere"
    assert labels["nvidia.com/mig.strategy"] == "mixed"
    assert labels["nvidia.com/mig-1g.10gb.count"] == "28"
    assert labels["nvidia.com/cuda.driver-version.major"] == "550"


@pytest.mark.usefixtures("same_pod")
def test_helm_upgrade_with_a_changed_config_reloads_without_a_restart() -> None:
    helm("upgrade", RELEASE, str(CHART), "--values", str(with_config(3)), "--wait")
    # dedicated (the default) now 3 ways: 12 replicas, once the kubelet syncs the volume
    wait_until(f"{GPU} allocatable 12", lambda: extended(GPU) == 12, timeout=CONFIGMAP_SYNC)
    assert extended(MIG) == 28
    wait_until(
        "gpu.replicas 3 on the Node",
        lambda: node_labels().get("nvidia.com/gpu.replicas") == "3",
        timeout=LABEL_SWITCH,
    )


def test_uninstall_leaves_no_object_of_the_chart_and_the_labels(first_pod: tuple[str, int]) -> None:
    # the last scenario: the pod check runs first, then the release goes
    assert identity() == (first_pod[0], 0)
    helm("uninstall", RELEASE, "--wait", "--timeout", "120s")
    wait_until("no object of the release", lambda: not chart_objects(), timeout=120)
    assert RELEASE not in helm("list", "--short").split()
    # GPU labels are not objects of the chart: a restart or an uninstall never removes them
    assert node_labels()["nvidia.com/gpu.product"].startswith("NVIDIA-A100-SXM4-80GB")
