"""Only its own node, on the real API server (`make e2e-cluster`): each daemon's own token can
write nothing beyond its own node's objects.

The DRA driver is applied from manifests/overlays/simulated-node-dra, then (once it is gone:
where a device plugin serves, the driver stands aside and withdraws its slices) the device
plugin installed with the chart and e2e/cluster/values-simulated-node.yaml, each with its
ValidatingAdmissionPolicy. A second Node object, made here with the admin's credentials and
deleted afterwards, is the other node. Each daemon pod's projected service-account token is read
where the kubelet writes it on the host (`<kubelet root>/pods/<uid>/volumes/
kubernetes.io~projected/*/token`) and used with nothing else: kubectl with a kubeconfig of the
API server's address, its CA and that token for slices, and for Nodes the plugin's own request,
a JSON merge patch (kubectl patch would read the Node first, which the plugin's role does not
allow). What the policies refuse is refused with the policy's name, what the daemon needs goes
through, and the daemons keep publishing and labelling under the policies. Scenarios run in
file order.
"""

from __future__ import annotations

import json
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

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
from e2e.cluster.layout import API_PORT, KUBELET_ROOT, PKI
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


API = f"https://127.0.0.1:{API_PORT}"


class Answer(NamedTuple):
    ok: bool
    text: str  # the error (kubectl's stderr, the API's Status message) or the output


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
                                "server": API,
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
        self._token = token

    def kubectl(self, *args: str, stdin: str | None = None) -> Answer:
        done = subprocess.run(
            [str(KUBECTL), f"--kubeconfig={self.kubeconfig}", *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
        )
        return Answer(done.returncode == 0, done.stdout if done.returncode == 0 else done.stderr)

    def patch_node(self, name: str, patch: Obj) -> Answer:
        """PATCH /api/v1/nodes/NAME with a JSON merge patch, as the plugin labels its Node."""
        request = urllib.request.Request(
            f"{API}/api/v1/nodes/{name}",
            data=json.dumps(patch).encode(),
            method="PATCH",
            headers={
                "Authorization": f"Bearer {self._token}",
                "Content-Type": "application/merge-patch+json",
            },
        )
        context = ssl.create_default_context(cafile=str(PKI / "ca.crt"))
        try:
            with urllib.request.urlopen(request, context=context, timeout=30) as response:
                return Answer(True, response.read().decode())
        except urllib.error.HTTPError as err:
            status = json.loads(err.read() or b"{}")
            return Answer(False, f"{err.code}: {status.get('message', '')}")

    def whoami(self) -> Obj:
        done = self.kubectl("auth", "whoami", "-o", "json")
        assert done.ok, done.text
        user: Obj = json.loads(done.text)["status"]["userInfo"]
        return user


def pod_token(pod: Obj) -> str:
    """The pod's projected service-account token, as the kubelet wrote it on the host."""
    uid = str(pod["metadata"]["uid"])
    volumes = KUBELET_ROOT / "pods" / uid / "volumes" / "kubernetes.io~projected"
    (path,) = volumes.glob("*/token")
    return path.read_text().strip()


def slice_manifest(
    name: str,
    node: str,
    driver: str = DRIVER,
    pool: str | None = None,
    generation: int = 1,
    counters: bool = False,
) -> str:
    """A slice of `node` in the pool `pool` (the node's own by default, as the driver names
    it): empty, or holding one set of shared counters (a dynamic-MIG slice) with `counters`."""
    spec: Obj = {
        "driver": driver,
        "nodeName": node,
        "pool": {"name": pool or node, "generation": generation, "resourceSliceCount": 1},
    }
    if counters:
        spec["sharedCounters"] = [
            {"name": "gpu-0-counters", "counters": {"memory": {"value": "80Gi"}}}
        ]
    return json.dumps(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": name, "labels": TEST_LABEL},
            "spec": spec,
        }
    )


def refused(answer: Answer, policy: str, why: str) -> None:
    """The request was refused by `policy` (not by RBAC, not for a malformed object), saying
    `why`."""
    assert not answer.ok, f"allowed: {answer.text}"
    assert f"ValidatingAdmissionPolicy '{policy}'" in answer.text, answer.text
    assert why in answer.text, answer.text


def label_patch(labels: dict[str, str | None]) -> Obj:
    return {"metadata": {"labels": labels}}


def node_labels(name: str = NODE_NAME) -> dict[str, str]:
    labels: dict[str, str] = get("node", name)["metadata"].get("labels", {})
    return labels


@pytest.fixture(scope="module", autouse=True)
def other_node() -> Iterator[None]:
    node: Obj = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": OTHER_NODE, "labels": {"kubernetes.io/hostname": OTHER_NODE}},
    }
    kubectl("delete", "node", OTHER_NODE, "--ignore-not-found")
    kubectl("create", "-f", "-", stdin=json.dumps(node))
    yield
    kubectl("delete", "resourceslices", "-l", "e2e=node-restriction", check=False)
    kubectl("delete", "node", OTHER_NODE, "--ignore-not-found", check=False)


def whoami_is(token: Token, account: str) -> None:
    """What the policies compare: the account, and the node the pod's token names."""
    user = token.whoami()
    assert user["username"] == f"system:serviceaccount:kube-system:{account}"
    assert user["extra"][NODE_NAME_KEY] == [NODE_NAME]


# Per class: the driver is gone before the plugin comes (where a device plugin serves, the driver
# stands aside and withdraws its slices).
@pytest.fixture(scope="class")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Token]:
    kubectl("apply", "-k", str(OVERLAY))
    wait_until("the driver pod Ready", lambda: daemon_ready(DRIVER_LABEL), timeout=240)
    wait_until("the node's slices", lambda: len(published()) == 32, timeout=120)
    yield Token(pod_token(daemon_pod(DRIVER_LABEL)), tmp_path_factory.mktemp("driver"))
    kubectl("delete", "-k", str(OVERLAY), "--wait=true", "--timeout=120s", check=False)
    wait_until(
        "no driver pod",
        lambda: not get("pods", "-n", "kube-system", "-l", DRIVER_LABEL)["items"],
    )


class TestTheDraDriver:
    def test_its_token_is_its_service_account_on_this_node(self, driver: Token) -> None:
        whoami_is(driver, "deviceplugin-dra")

    def test_it_may_not_publish_a_slice_for_another_node(self, driver: Token) -> None:
        def attempt() -> Answer | None:
            manifest = slice_manifest("e2e-nr-forged", OTHER_NODE)
            answer = driver.kubectl("create", "-f", "-", stdin=manifest)
            if answer.ok:  # a policy just created is in force within seconds
                kubectl("delete", "resourceslice", "e2e-nr-forged")
                return None
            return answer

        answer = wait_until("the slice policy refusing", attempt, timeout=30)
        refused(answer, SLICE_POLICY, f"the DRA driver on node {NODE_NAME} may write only")
        assert not kubectl("get", "resourceslices", "-l", "e2e=node-restriction", "-o", "name")

    def test_it_may_not_delete_or_update_another_nodes_slice(self, driver: Token) -> None:
        kubectl("create", "-f", "-", stdin=slice_manifest("e2e-nr-other", OTHER_NODE))
        answer = driver.kubectl("delete", "resourceslice", "e2e-nr-other")
        refused(answer, SLICE_POLICY, "may write only the ResourceSlices of that node")
        changed = get("resourceslice", "e2e-nr-other")
        changed["spec"]["pool"]["generation"] = 2
        answer = driver.kubectl("replace", "-f", "-", stdin=json.dumps(changed))
        refused(answer, SLICE_POLICY, "may write only the ResourceSlices of that node")
        assert get("resourceslice", "e2e-nr-other")["spec"]["pool"]["generation"] == 1
        kubectl("delete", "resourceslice", "e2e-nr-other")

    @pytest.mark.parametrize("counters", [False, True], ids=["devices", "shared-counters"])
    def test_it_may_not_publish_another_nodes_pool_on_its_own_node(
        self, driver: Token, counters: bool
    ) -> None:
        # a newer generation of the other node's pool would replace it for the scheduler, which
        # takes a pool's slices (and counters) whatever node each slice is on
        manifest = slice_manifest(
            "e2e-nr-pool", NODE_NAME, pool=OTHER_NODE, generation=1000, counters=counters
        )
        answer = driver.kubectl("create", "-f", "-", stdin=manifest)
        refused(
            answer,
            SLICE_POLICY,
            f"the DRA driver on node {NODE_NAME} may write only the pool of that node "
            f"(spec.pool.name {NODE_NAME})",
        )
        assert not kubectl("get", "resourceslices", "-l", "e2e=node-restriction", "-o", "name")

    def test_it_may_not_delete_another_pools_slice_on_its_own_node(self, driver: Token) -> None:
        manifest = slice_manifest("e2e-nr-stray", NODE_NAME, pool=OTHER_NODE)
        kubectl("create", "-f", "-", stdin=manifest)
        answer = driver.kubectl("delete", "resourceslice", "e2e-nr-stray")
        refused(answer, SLICE_POLICY, "may write only the pool of that node")
        assert get("resourceslice", "e2e-nr-stray")["spec"]["pool"]["name"] == OTHER_NODE
        kubectl("delete", "resourceslice", "e2e-nr-stray")

    def test_it_may_not_publish_another_drivers_slice(self, driver: Token) -> None:
        manifest = slice_manifest("e2e-nr-foreign", NODE_NAME, driver="gpu.example.com")
        answer = driver.kubectl("create", "-f", "-", stdin=manifest)
        refused(answer, SLICE_POLICY, f"may write only ResourceSlices of spec.driver {DRIVER}")

    def test_a_token_of_its_account_bound_to_no_node_writes_nothing(
        self, driver: Token, tmp_path: Path
    ) -> None:
        token = kubectl("create", "token", "deviceplugin-dra", "-n", "kube-system").strip()
        unbound = Token(token, tmp_path)
        assert NODE_NAME_KEY not in unbound.whoami().get("extra", {})
        manifest = slice_manifest("e2e-nr-unbound", NODE_NAME)
        answer = unbound.kubectl("create", "-f", "-", stdin=manifest)
        refused(answer, SLICE_POLICY, "a token bound to no node may not write ResourceSlices")

    @pytest.mark.parametrize("counters", [False, True], ids=["devices", "shared-counters"])
    def test_it_may_publish_and_delete_a_slice_of_its_own_pool(
        self, driver: Token, counters: bool
    ) -> None:
        # generation 0, older than the driver's: the scheduler ignores it meanwhile
        manifest = slice_manifest("e2e-nr-own", NODE_NAME, generation=0, counters=counters)
        answer = driver.kubectl("create", "-f", "-", stdin=manifest)
        assert answer.ok, answer.text
        # the driver itself may remove it first (a slice of its node it did not write): either
        # way, a delete of this node's slice by the driver's token went through
        answer = driver.kubectl("delete", "resourceslice", "e2e-nr-own", "--ignore-not-found")
        assert answer.ok, answer.text

    def test_it_republishes_its_own_slices_under_the_policy(self, driver: Token) -> None:
        wait_until("the pool whole", lambda: len(published()) == 32, timeout=120)
        before = set(published())
        victim = next(
            s["metadata"]["name"]
            for s in get("resourceslices", f"--field-selector=spec.nodeName={NODE_NAME}")["items"]
            if s["spec"]["driver"] == DRIVER and s["spec"].get("devices")
        )
        kubectl("delete", "resourceslice", victim)
        # the driver sees its pool changed by someone else and writes it again, with its token
        wait_until("the pool published again", lambda: set(published()) == before, timeout=120)


@pytest.fixture(scope="class")
def plugin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Token]:
    helm("install", RELEASE, str(CHART), "--values", str(VALUES), "--wait", "--timeout", "240s")
    wait_until("the plugin pod Ready", lambda: daemon_ready(PLUGIN_LABEL), timeout=240)
    yield Token(pod_token(daemon_pod(PLUGIN_LABEL)), tmp_path_factory.mktemp("plugin"))
    if RELEASE in helm("list", "--short").split():
        helm("uninstall", RELEASE, "--wait", "--timeout", "120s")
    for key in (STALE_GPU_LABEL, "e2e.example.com/foreign", "nvidia.com/device-plugin.config"):
        kubectl("label", "node", NODE_NAME, f"{key}-", check=False)


class TestTheDevicePlugin:
    def test_its_token_is_its_service_account_on_this_node(self, plugin: Token) -> None:
        whoami_is(plugin, f"{RELEASE}-deviceplugin")

    def test_it_may_not_label_another_node(self, plugin: Token) -> None:
        def attempt() -> Answer | None:
            answer = plugin.patch_node(OTHER_NODE, label_patch({"nvidia.com/gpu.product": "x"}))
            return None if answer.ok else answer

        answer = wait_until("the node policy refusing", attempt, timeout=30)
        refused(answer, NODE_POLICY, f"the device plugin on node {NODE_NAME} may not write Node")
        assert "nvidia.com/gpu.product" not in node_labels(OTHER_NODE)

    @pytest.mark.parametrize("key", ["e2e.example.com/foreign", "nvidia.com/device-plugin.config"])
    def test_it_may_not_set_a_key_it_does_not_own_on_its_own_node(
        self, plugin: Token, key: str
    ) -> None:
        before = node_labels().get(key)
        answer = plugin.patch_node(NODE_NAME, label_patch({key: "x"}))
        refused(answer, NODE_POLICY, "may change only the GPU labels it owns")
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
    def test_it_may_not_change_anything_else_of_its_own_node(
        self, plugin: Token, patch: Obj, why: str
    ) -> None:
        answer = plugin.patch_node(NODE_NAME, patch)
        refused(answer, NODE_POLICY, why)
        node = get("node", NODE_NAME)
        assert not node["spec"].get("unschedulable")
        assert "e2e" not in [taint["key"] for taint in node["spec"].get("taints", [])]
        assert "e2e" not in node["metadata"].get("annotations", {})

    def test_it_may_write_a_gpu_label_and_removes_a_stale_one_itself(self, plugin: Token) -> None:
        answer = plugin.patch_node(NODE_NAME, label_patch({STALE_GPU_LABEL: "1"}))
        assert answer.ok, answer.text
        assert json.loads(answer.text)["metadata"]["labels"][STALE_GPU_LABEL] == "1"
        # not a label of this node's GPUs: the plugin's next sync removes it, by a patch of its
        # own token that the policy lets through
        wait_until(
            f"{STALE_GPU_LABEL} removed by the plugin",
            lambda: STALE_GPU_LABEL not in node_labels(),
            timeout=60,
        )
        labels = node_labels()
        assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
        assert labels["nvidia.com/mig-1g.10gb.count"] == "28"
