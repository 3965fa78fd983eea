"""Only its own node, on the real API server (`make e2e-cluster`): each daemon's own token can
write nothing beyond its own node's objects.

The DRA driver is applied from manifests/overlays/simulated-node-dra and the device plugin
installed with the chart and e2e/cluster/values-simulated-node.yaml, each with its
ValidatingAdmissionPolicy. A second Node object, made here with the admin's credentials and
deleted afterwards, is the other node. Each daemon pod's projected service-account token is read
where the kubelet writes it on the host (`<kubelet root>/pods/<uid>/volumes/
kubernetes.io~projected/*/token`) and used with kubectl (its own kubeconfig: the API server's
address and CA, that token, nothing else): what the policies refuse is refused with the
policy's name, what the daemon needs goes through, and the daemons keep publishing and labelling
under the policies. Scenarios run in file order.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.cluster.kube import (
    KUBECTL,
    NODE_NAME,
    REPO,
    Obj,
    daemon_pod,
    daemon_ready,
    get,
    helm,
    kubectl,
    wait_until,
)
from e2e.cluster.node import API_PORT, KUBELET_ROOT, PKI
from e2e.cluster.test_dra import DRIVER, DRIVER_LABEL, OVERLAY, published

OTHER_NODE = "deviceplugin-e2e-other"
RELEASE = "gpu"
CHART = REPO / "manifests" / "helm" / "deviceplugin"
VALUES = REPO / "e2e" / "cluster" / "values-simulated-node.yaml"
PLUGIN_LABEL = f"app.kubernetes.io/name=deviceplugin,app.kubernetes.io/instance={RELEASE}"
SLICE_POLICY = "deviceplugin-dra-resourceslices"
NODE_POLICY = f"{RELEASE}-deviceplugin-nodes"
NODE_NAME_KEY = "authentication.kubernetes.io/node-name"
TEST_LABEL = {"e2e": "node-restriction"}
# A key the plugin owns but does not write on this node: it removes it again by itself.
STALE_GPU_LABEL = "nvidia.com/mig-7g.80gb.count"


class Token:
    """kubectl with one pod's token and nothing else: its own kubeconfig holds the API server's
    address and CA and the token (no client certificate of the admin's to fall back on)."""

    def __init__(self, token: str, folder: Path) -> None:
        self.kubeconfig = folder / "kubeconfig"
        self.kubeconfig.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {
                            "name": "e2e",
                            "cluster": {
                                "server": f"https://127.0.0.1:{API_PORT}",
                                "certificate-authority": str(PKI / "ca.crt"),
                            },
                        }
                    ],
                    "users": [{"name": "pod", "user": {"token": token}}],
                    "contexts": [{"name": "pod", "context": {"cluster": "e2e", "user": "pod"}}],
                    "current-context": "pod",
                }
            )
        )
        self.kubeconfig.chmod(0o600)

    def kubectl(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(KUBECTL), f"--kubeconfig={self.kubeconfig}", *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def whoami(self) -> Obj:
        done = self.kubectl("auth", "whoami", "-o", "json")
        assert done.returncode == 0, done.stderr
        user: Obj = json.loads(done.stdout)["status"]["userInfo"]
        return user


def pod_token(pod: Obj) -> str:
    """The pod's projected service-account token, as the kubelet wrote it on the host."""
    uid = str(pod["metadata"]["uid"])
    volumes = KUBELET_ROOT / "pods" / uid / "volumes" / "kubernetes.io~projected"
    (path,) = volumes.glob("*/token")
    return path.read_text().strip()


def slice_manifest(name: str, node: str, driver: str = DRIVER) -> str:
    return json.dumps(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": name, "labels": TEST_LABEL},
            "spec": {
                "driver": driver,
                "nodeName": node,
                "pool": {"name": f"e2e-{name}", "generation": 1, "resourceSliceCount": 1},
            },
        }
    )


def refused(done: subprocess.CompletedProcess[str], policy: str, why: str) -> None:
    """The request was refused by `policy` (not by RBAC, not for a malformed object), saying
    `why`."""
    assert done.returncode != 0, f"allowed: {done.stdout}"
    assert f"ValidatingAdmissionPolicy '{policy}'" in done.stderr, done.stderr
    assert why in done.stderr, done.stderr


def label_patch(labels: dict[str, str | None]) -> str:
    return json.dumps({"metadata": {"labels": labels}})


def node_labels(name: str = NODE_NAME) -> dict[str, str]:
    labels: dict[str, str] = get("node", name)["metadata"].get("labels", {})
    return labels


@pytest.fixture(scope="module", autouse=True)
def daemons() -> Iterator[None]:
    other: Obj = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": OTHER_NODE, "labels": {"kubernetes.io/hostname": OTHER_NODE}},
    }
    kubectl("delete", "node", OTHER_NODE, "--ignore-not-found")
    kubectl("create", "-f", "-", stdin=json.dumps(other))
    kubectl("apply", "-k", str(OVERLAY))
    helm("install", RELEASE, str(CHART), "--values", str(VALUES), "--wait", "--timeout", "240s")
    wait_until("the driver pod Ready", lambda: daemon_ready(DRIVER_LABEL), timeout=240)
    wait_until("the plugin pod Ready", lambda: daemon_ready(PLUGIN_LABEL), timeout=240)
    wait_until("the node's slices", lambda: len(published()) == 32, timeout=120)
    yield
    if RELEASE in helm("list", "--short").split():
        helm("uninstall", RELEASE, "--wait", "--timeout", "120s")
    kubectl("delete", "-k", str(OVERLAY), "--wait=true", "--timeout=120s", check=False)
    kubectl("delete", "resourceslices", "-l", "e2e=node-restriction", check=False)
    kubectl("delete", "node", OTHER_NODE, "--ignore-not-found", check=False)
    for key in (STALE_GPU_LABEL, "e2e.example.com/foreign", "nvidia.com/device-plugin.config"):
        kubectl("label", "node", NODE_NAME, f"{key}-", check=False)


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Token:
    return Token(pod_token(daemon_pod(DRIVER_LABEL)), tmp_path_factory.mktemp("driver"))


@pytest.fixture(scope="module")
def plugin(tmp_path_factory: pytest.TempPathFactory) -> Token:
    return Token(pod_token(daemon_pod(PLUGIN_LABEL)), tmp_path_factory.mktemp("plugin"))


def test_each_token_is_its_service_account_on_this_node(driver: Token, plugin: Token) -> None:
    # what the policies compare: the account, and the node the pod's token names
    for token, account in ((driver, "deviceplugin-dra"), (plugin, f"{RELEASE}-deviceplugin")):
        user = token.whoami()
        assert user["username"] == f"system:serviceaccount:kube-system:{account}"
        assert user["extra"][NODE_NAME_KEY] == [NODE_NAME]


def test_the_driver_may_not_publish_a_slice_for_another_node(driver: Token) -> None:
    def attempt() -> subprocess.CompletedProcess[str] | None:
        done = driver.kubectl(
            "create", "-f", "-", stdin=slice_manifest("e2e-nr-forged", OTHER_NODE)
        )
        if done.returncode == 0:  # a policy just created is in force within seconds
            kubectl("delete", "resourceslice", "e2e-nr-forged")
            return None
        return done

    done = wait_until("the slice policy refusing", attempt, timeout=30)
    refused(done, SLICE_POLICY, f"the DRA driver on node {NODE_NAME} may write only")
    assert not kubectl("get", "resourceslices", "-l", "e2e=node-restriction", "-o", "name")


def test_the_driver_may_not_delete_or_take_over_another_nodes_slice(driver: Token) -> None:
    kubectl("create", "-f", "-", stdin=slice_manifest("e2e-nr-other", OTHER_NODE))
    done = driver.kubectl("delete", "resourceslice", "e2e-nr-other")
    refused(done, SLICE_POLICY, "may write only the ResourceSlices of that node")
    # an update is checked against the old slice too: moving it to this node is no way in
    moved = get("resourceslice", "e2e-nr-other")
    moved["spec"]["nodeName"] = NODE_NAME
    done = driver.kubectl("replace", "-f", "-", stdin=json.dumps(moved))
    refused(done, SLICE_POLICY, "may write only the ResourceSlices of that node")
    assert get("resourceslice", "e2e-nr-other")["spec"]["nodeName"] == OTHER_NODE
    kubectl("delete", "resourceslice", "e2e-nr-other")


def test_the_driver_may_not_publish_another_drivers_slice(driver: Token) -> None:
    manifest = slice_manifest("e2e-nr-foreign", NODE_NAME, driver="gpu.example.com")
    done = driver.kubectl("create", "-f", "-", stdin=manifest)
    refused(done, SLICE_POLICY, f"may write only ResourceSlices of spec.driver {DRIVER}")


def test_a_token_of_the_drivers_account_bound_to_no_node_writes_nothing(tmp_path: Path) -> None:
    token = kubectl("create", "token", "deviceplugin-dra", "-n", "kube-system").strip()
    unbound = Token(token, tmp_path)
    assert NODE_NAME_KEY not in unbound.whoami().get("extra", {})
    done = unbound.kubectl("create", "-f", "-", stdin=slice_manifest("e2e-nr-unbound", NODE_NAME))
    refused(done, SLICE_POLICY, "a token bound to no node may not write ResourceSlices")


def test_the_driver_may_publish_and_delete_a_slice_of_its_own_node(driver: Token) -> None:
    done = driver.kubectl("create", "-f", "-", stdin=slice_manifest("e2e-nr-own", NODE_NAME))
    assert done.returncode == 0, done.stderr
    # the driver itself may remove it first (a slice of its pool it did not write): either way,
    # a delete of this node's slice by the driver's token went through
    done = driver.kubectl("delete", "resourceslice", "e2e-nr-own", "--ignore-not-found")
    assert done.returncode == 0, done.stderr


def test_the_driver_republishes_its_own_slices_under_the_policy() -> None:
    before = set(published())
    victim = next(
        s["metadata"]["name"]
        for s in get("resourceslices", f"--field-selector=spec.driver={DRIVER}")["items"]
        if s["spec"].get("devices")
    )
    kubectl("delete", "resourceslice", victim)
    # the driver sees its pool changed by someone else and writes it again, with its token
    wait_until("the pool published again", lambda: set(published()) == before, timeout=120)


def test_the_plugin_may_not_label_another_node(plugin: Token) -> None:
    def attempt() -> subprocess.CompletedProcess[str] | None:
        patch = label_patch({"nvidia.com/gpu.product": "forged"})
        done = plugin.kubectl("patch", "node", OTHER_NODE, "--type=merge", "-p", patch)
        return None if done.returncode == 0 else done

    done = wait_until("the node policy refusing", attempt, timeout=30)
    refused(done, NODE_POLICY, f"the device plugin on node {NODE_NAME} may not write Node")
    assert "nvidia.com/gpu.product" not in node_labels(OTHER_NODE)


@pytest.mark.parametrize("key", ["e2e.example.com/foreign", "nvidia.com/device-plugin.config"])
def test_the_plugin_may_not_set_a_key_it_does_not_own_on_its_own_node(
    plugin: Token, key: str
) -> None:
    before = node_labels().get(key)
    done = plugin.kubectl("patch", "node", NODE_NAME, "--type=merge", "-p", label_patch({key: "x"}))
    refused(done, NODE_POLICY, "may change only the GPU labels it owns")
    assert node_labels().get(key) == before


@pytest.mark.parametrize(
    ("patch", "why"),
    [
        ({"spec": {"unschedulable": True}}, "may not change a Node's spec"),
        (
            {"spec": {"taints": [{"key": "e2e", "effect": "NoSchedule"}]}},
            "may not change a Node's spec",
        ),
        ({"metadata": {"annotations": {"e2e": "x"}}}, "may not change a Node's annotations"),
    ],
    ids=["unschedulable", "taint", "annotation"],
)
def test_the_plugin_may_not_change_anything_else_of_its_own_node(
    plugin: Token, patch: Obj, why: str
) -> None:
    done = plugin.kubectl("patch", "node", NODE_NAME, "--type=merge", "-p", json.dumps(patch))
    refused(done, NODE_POLICY, why)
    node = get("node", NODE_NAME)
    assert not node["spec"].get("unschedulable")
    assert "e2e" not in node["metadata"].get("annotations", {})


def test_the_plugin_may_write_a_gpu_label_and_removes_a_stale_one_itself(plugin: Token) -> None:
    done = plugin.kubectl(
        "patch", "node", NODE_NAME, "--type=merge", "-p", label_patch({STALE_GPU_LABEL: "1"})
    )
    assert done.returncode == 0, done.stderr
    assert node_labels()[STALE_GPU_LABEL] == "1"
    # not a label of this node's GPUs: the plugin's next sync removes it, by a patch of its own
    # token that the policy lets through
    wait_until(
        f"{STALE_GPU_LABEL} removed by the plugin",
        lambda: STALE_GPU_LABEL not in node_labels(),
        timeout=60,
    )
    labels = node_labels()
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
    assert labels["nvidia.com/mig-1g.10gb.count"] == "28"
