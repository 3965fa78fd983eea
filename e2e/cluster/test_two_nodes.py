"""Two real nodes on one control plane (`NODES=2 e2e/cluster/cluster up`, docs/cluster.md "Two
nodes"): node 1 the simulated a100-80gb-x8-mixed node, node 2 the preset NODE2_PRESET (a10-x8 by
default), each with its own kubelet, containerd and, through node 2's own mount namespace, its own
/var/lib/kubelet, /var/run/cdi and /var/lib/deviceplugin-sim; the kustomize overlays as they are.

Checked through the API, the workloads and each node's view of the host (`cluster exec`): each
node advertises its own preset's resources under the seed config and MIG pods land only where MIG
is; node 1 on the device plugin and node 2 on DRA by its label serve the same unchanged pod spec;
a claim's attributes pick the node; node 2's driver token is refused node 1's slices; a restart
of node 2's driver or kubelet leaves node 1's slices alone; an Xid on a node-2 GPU takes only that
GPU out. Skipped, with the reason, unless the cluster has two nodes (run/nodes). Classes run in
file order; each deploys what it needs and removes it.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from deviceplugin.sim.node import Node, read_node, resolve_node_path
from e2e.cluster import processes
from e2e.cluster.kube import (
    EVENTS,
    NODE_NAME,
    REPO,
    SECOND_NODE,
    Obj,
    apply,
    cluster,
    daemon_pod,
    daemon_ready,
    extended,
    get,
    helm,
    kubectl,
    on_node,
    pod,
    pod_running,
    unschedulable_reason,
    wait_until,
    workload_pod,
)
from e2e.cluster.layout import FIRST, KUBELET_ROOT, RUN, SECOND
from e2e.cluster.served import served
from e2e.cluster.test_dra import (
    DRIVER,
    DRIVER_LABEL,
    OVERLAY,
    claim_pod,
    claim_template,
    complete_pool,
    newest_devices,
)
from e2e.cluster.test_helm import CHART, CONFIG_LABEL, RELEASE
from e2e.cluster.test_helm import VALUES as HELM_VALUES
from e2e.cluster.test_migration import EXTENDED_CLASSES, PLUGIN_LABEL, ours
from e2e.cluster.test_node_restriction import (
    NODE_NAME_KEY,
    SLICE_POLICY,
    Token,
    pod_token,
    refused,
    slice_manifest,
)
from e2e.cluster.test_rolling_update import Lowest
from e2e.cluster.topology import recorded

TOPOLOGY = recorded()
pytestmark = pytest.mark.skipif(
    TOPOLOGY.count != 2,
    reason=f"needs two nodes: `NODES=2 e2e/cluster/cluster up` (run/nodes says {TOPOLOGY.count})",
)

GPU, MIG = "nvidia.com/gpu", "nvidia.com/mig-1g.10gb"
DRA_LABEL = "nvidia.com/dra"
PLUGIN_OVERLAY = REPO / "manifests" / "overlays" / "simulated-node"
FIRST_MODEL = read_node(resolve_node_path("a100-80gb-x8-mixed"))
SECOND_MODEL = read_node(resolve_node_path(TOPOLOGY.second_preset))
REPLICAS = 2  # the seed config's time-slicing of each whole GPU
SECOND_EVENTS = "/var/lib/deviceplugin-sim/events.jsonl"  # as node 2 sees it
NODES = (NODE_NAME, SECOND_NODE)


def seed_resources(model: Node) -> dict[str, int]:
    """What the device plugin advertises for a simulated node under the seed config
    (migStrategy mixed, 2 replicas of each whole GPU)."""
    found = {GPU: REPLICAS * sum(not gpu.mig_enabled for gpu in model.gpus)}
    for gpu in model.gpus:
        for mig in gpu.mig_devices:
            resource = f"nvidia.com/mig-{mig.profile}"
            found[resource] = found.get(resource, 0) + 1
    return found


def devices_of(model: Node) -> int:
    """How many devices the DRA driver publishes for it: each whole GPU, each MIG device."""
    return sum(len(gpu.mig_devices) if gpu.mig_enabled else 1 for gpu in model.gpus)


def node_of(name: str) -> str:
    return str(pod(name)["spec"]["nodeName"])


def on(node: str, manifest: Obj) -> Obj:
    manifest["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    return manifest


def start_all(manifests: list[Obj], timeout: float = 240) -> list[str]:
    names = [str(m["metadata"]["name"]) for m in manifests]
    for manifest in manifests:
        apply(manifest)
    for name in names:
        wait_until(f"{name} Running", lambda: pod_running(name), timeout=timeout)  # noqa: B023
    return names


def delete_workloads() -> None:
    kubectl(
        "delete", "pod", "-n", "default", "-l", "e2e=two-nodes", "--wait=true", "--timeout=180s"
    )


def workload(name: str, limits: dict[str, str]) -> Obj:
    manifest = workload_pod(name, limits)
    manifest["metadata"]["labels"] = {"e2e": "two-nodes"}
    return manifest


def claim_workload(name: str, template: str) -> Obj:
    return claim_pod(name, template, {"e2e": "two-nodes"})


def node_slices(node: str) -> list[Obj]:
    items: list[Obj] = get(
        "resourceslices", f"--field-selector=spec.driver={DRIVER},spec.nodeName={node}"
    )["items"]
    return items


def pool(node: str) -> dict[str, Obj] | None:
    """The node's published devices by name, once every slice of its pool's newest generation
    is there; None before."""
    return complete_pool(node_slices(node))


def pool_of_size(node: str, size: int) -> dict[str, Obj] | None:
    devices = pool(node)
    return devices if devices is not None and len(devices) == size else None


def versions(node: str) -> dict[str, tuple[str, int]]:
    """Each of the node's slices: its resourceVersion and pool generation (any write changes
    the first)."""
    return {
        s["metadata"]["name"]: (s["metadata"]["resourceVersion"], s["spec"]["pool"]["generation"])
        for s in node_slices(node)
    }


def attribute(device: Obj, name: str) -> object:
    value: Obj = device["attributes"][name]
    return next(iter(value.values()))


def no_daemon_pods(label: str) -> bool:
    return not get("pods", "-n", "kube-system", "-l", label)["items"]


def label_second_node(value: str | None) -> None:
    setting = f"{DRA_LABEL}={value}" if value else f"{DRA_LABEL}-"
    kubectl("label", "node", SECOND_NODE, setting, "--overwrite")


@pytest.fixture(autouse=True)
def no_workloads_left() -> Iterator[None]:
    yield
    delete_workloads()


def test_both_nodes_are_ready_with_node_2_in_its_own_mount_namespace() -> None:
    for name in NODES:
        node = get("node", name)
        ready = [c["status"] for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready == ["True"], (name, ready)
    addresses = {a["type"]: a["address"] for a in get("node", SECOND_NODE)["status"]["addresses"]}
    assert addresses["InternalIP"] == SECOND.ip
    endpoint = get("node", SECOND_NODE)["status"]["daemonEndpoints"]["kubeletEndpoint"]
    assert endpoint["Port"] == SECOND.kubelet_port
    inside = processes.in_namespace_of(SECOND)
    for name in ("mountns-2", "containerd-2", "kubelet-2"):
        pid = processes.pid_of(name)
        assert pid is not None and pid in inside, name
        assert processes.processes()[pid][2] == processes.pid_of(processes.REAPER), name
    assert (
        processes.pid_of("kubelet") not in inside and processes.pid_of("containerd") not in inside
    )
    # Each node's simulated node at the same path, each its own preset.
    marker = "/var/lib/deviceplugin-sim/root/etc/deviceplugin-sim/sim-root.json"
    for number, model in ((1, FIRST_MODEL), (2, SECOND_MODEL)):
        seen = json.loads(on_node(number, f"cat {marker}"))
        assert (seen["gpus"], seen["driverVersion"]) == (len(model.gpus), model.driver_version)
    # node 2's kubelet root is its own folder, node 1's the host's
    own = SECOND.host_path(KUBELET_ROOT).stat()
    identity = f"stat -c '%d %i' {KUBELET_ROOT}"
    assert on_node(2, identity).split() == [str(own.st_dev), str(own.st_ino)]
    assert on_node(1, identity) != on_node(2, identity)


def test_pods_on_either_node_reach_each_other() -> None:
    serve = "mkdir -p /w && hostname > /w/index.html && exec httpd -f -p 8080 -h /w"
    manifests = []
    for name, node in (("web-1", NODE_NAME), ("web-2", SECOND_NODE)):
        manifest = on(node, workload(name, {}))
        manifest["spec"]["containers"][0]["command"] = ["sh", "-c", serve]
        manifests.append(manifest)
    start_all(manifests)
    ips = {name: pod(name)["status"]["podIP"] for name in ("web-1", "web-2")}
    for here, there in (("web-1", "web-2"), ("web-2", "web-1")):
        # busybox's nc, not its wget (which crashes in this image): the page is the last line
        request = f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 5 {ips[there]} 8080"
        fetch = ("exec", here, "--", "sh", "-c", request)
        wait_until(
            f"{here} fetching {there}'s page",
            lambda: kubectl(*fetch, check=False).strip().splitlines()[-1:] == [there],  # noqa: B023
            timeout=60,
        )


@pytest.fixture(scope="class")
def plugin_on_both() -> Iterator[None]:
    kubectl("apply", "-k", str(PLUGIN_OVERLAY))
    for node in NODES:
        wait_until(f"the plugin Ready on {node}", lambda: daemon_ready(PLUGIN_LABEL, node), 240)  # noqa: B023
    yield
    delete_workloads()
    kubectl("delete", "-k", str(PLUGIN_OVERLAY), "--wait=true", "--timeout=120s", check=False)
    wait_until("no plugin pod", lambda: no_daemon_pods(PLUGIN_LABEL), timeout=120)


@pytest.mark.usefixtures("plugin_on_both")
class TestTheSeedConfigOnBothNodes:
    def test_each_node_advertises_its_own_presets_resources(self) -> None:
        wait_until(f"{GPU} 8 on node 1", lambda: extended(GPU) == 8, timeout=120)
        assert extended(MIG) == 28
        wanted = seed_resources(SECOND_MODEL)
        wait_until(
            f"{wanted} on node 2",
            lambda: all(extended(r, SECOND_NODE) == n for r, n in wanted.items()),
            timeout=120,
        )
        advertised = get("node", SECOND_NODE)["status"]["allocatable"]
        assert {
            r for r, n in advertised.items() if r.startswith("nvidia.com/") and n != "0"
        } == set(wanted)
        if TOPOLOGY.second_preset == "a10-x8":  # the seed's A10 node
            assert wanted == {GPU: 16}

    def test_mig_pods_land_on_node_1_only(self) -> None:
        names = start_all([workload(f"mig-{n}", {MIG: "1"}) for n in range(6)])
        assert {node_of(name) for name in names} == {NODE_NAME}

    def test_gpu_pods_fill_both_nodes(self) -> None:
        count = extended(GPU) + extended(GPU, SECOND_NODE) - 4
        names = start_all([workload(f"gpu-{n}", {GPU: "1"}) for n in range(count)])
        placed = [node_of(name) for name in names]
        assert set(placed) == set(NODES), placed  # more pods than either node holds
        assert placed.count(NODE_NAME) <= extended(GPU)
        assert placed.count(SECOND_NODE) <= extended(GPU, SECOND_NODE)


@pytest.fixture(scope="class")
def mixed() -> Iterator[None]:
    """Node 1 on the device plugin, node 2 on DRA by its label (manifests/overlays/dra-label's
    patches on the simulated-node overlays), the extended-resource classes applied."""
    label_second_node("true")
    kubectl("apply", "-f", str(EXTENDED_CLASSES))
    apply_text(ours(plugin=True))
    apply_text(ours(plugin=False))
    wait_until("the plugin Ready on node 1", lambda: daemon_ready(PLUGIN_LABEL, NODE_NAME), 240)
    wait_until("the driver Ready on node 2", lambda: daemon_ready(DRIVER_LABEL, SECOND_NODE), 240)
    wait_until(
        "node 2's pool", lambda: pool_of_size(SECOND_NODE, devices_of(SECOND_MODEL)), timeout=120
    )
    yield
    delete_workloads()
    for manifests in (ours(plugin=True), ours(plugin=False)):
        kubectl("delete", "-f", "-", "--wait=true", "--timeout=120s", stdin=manifests, check=False)
    kubectl("delete", "-f", str(EXTENDED_CLASSES), "--wait=true", check=False)
    label_second_node(None)
    wait_until("no plugin pod", lambda: no_daemon_pods(PLUGIN_LABEL), timeout=120)
    wait_until("no driver pod", lambda: no_daemon_pods(DRIVER_LABEL), timeout=120)


def daemon_nodes(label: str) -> set[str]:
    return {p["spec"]["nodeName"] for p in get("pods", "-n", "kube-system", "-l", label)["items"]}


def apply_text(manifests: str) -> None:
    kubectl("apply", "-f", "-", stdin=manifests)


@pytest.mark.usefixtures("mixed")
class TestDevicePluginAndDraSideBySide:
    def test_each_node_has_one_of_the_two_and_slices_only_the_dra_node(self) -> None:
        assert daemon_nodes(PLUGIN_LABEL) == {NODE_NAME}
        assert daemon_nodes(DRIVER_LABEL) == {SECOND_NODE}
        found = get("resourceslices", f"--field-selector=spec.driver={DRIVER}")["items"]
        assert found and {s["spec"]["nodeName"] for s in found} == {SECOND_NODE}
        wait_until(f"{GPU} 8 on node 1", lambda: extended(GPU) == 8, timeout=120)
        wait_until(f"{GPU} 0 on node 2", lambda: extended(GPU, SECOND_NODE) == 0)  # no plugin

    def test_a_dozen_unchanged_gpu_pods_run_on_both_nodes(self) -> None:
        if not served("DRAExtendedResource"):
            pytest.skip("DRAExtendedResource is off on this version: DRA serves no limits pod")
        names = start_all([workload(f"unchanged-{n}", {GPU: "1"}) for n in range(12)])
        placed = {name: node_of(name) for name in names}
        assert set(placed.values()) == set(NODES), placed  # 12 pods, 8 fit on either node
        for name, node in placed.items():
            made = pod(name)["status"].get("extendedResourceClaimStatus")
            if node == SECOND_NODE:  # served by DRA: a claim the scheduler made for it
                assert made and made["resourceClaimName"], (name, made)
            else:
                assert made is None, (name, made)
        claims = get("resourceclaims", "-n", "default")["items"]
        owners = {o["name"] for c in claims for o in c["metadata"].get("ownerReferences", [])}
        assert owners == {n for n, node in placed.items() if node == SECOND_NODE}


# One config per node type, chosen by the node label the reference's chart reads: the A10s
# time-sliced four ways for inference, the A100s as MIG devices (migStrategy mixed) and whole.
PER_NODE_CONFIGS = {
    "a100-mig": "version: v1\nflags:\n  migStrategy: mixed\n",
    "a10-inference": (
        "version: v1\nflags:\n  migStrategy: none\nsharing:\n  timeSlicing:\n"
        "    resources:\n      - name: nvidia.com/gpu\n        replicas: 4\n"
    ),
}


@pytest.fixture(scope="class")
def chart_per_node_type(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    values = yaml.safe_load(HELM_VALUES.read_text())
    values["config"] = {"default": "a100-mig", "map": PER_NODE_CONFIGS}
    path = tmp_path_factory.mktemp("helm") / "values.yaml"
    path.write_text(json.dumps(values))
    kubectl("label", "node", SECOND_NODE, f"{CONFIG_LABEL}=a10-inference", "--overwrite")
    helm("install", RELEASE, str(CHART), "--values", str(path), "--wait", "--timeout", "240s")
    yield
    delete_workloads()
    helm("uninstall", RELEASE, "--wait", "--timeout", "120s")
    kubectl("label", "node", SECOND_NODE, f"{CONFIG_LABEL}-")


@pytest.mark.usefixtures("chart_per_node_type")
class TestTheChartsConfigPerNodeType:
    def test_each_node_serves_the_config_its_label_names(self) -> None:
        a10s = len(SECOND_MODEL.gpus)
        whole = sum(not gpu.mig_enabled for gpu in FIRST_MODEL.gpus)
        wait_until(f"{GPU} {4 * a10s} on node 2", lambda: extended(GPU, SECOND_NODE) == 4 * a10s)
        wait_until(f"{GPU} {whole} on node 1", lambda: extended(GPU) == whole, timeout=120)
        wait_until(f"{MIG} 28 on node 1", lambda: extended(MIG) == 28)
        assert extended(MIG, SECOND_NODE) == 0
        # four pods share each A10; a MIG pod goes where MIG is
        names = start_all(
            [on(SECOND_NODE, workload(f"inference-{n}", {GPU: "1"})) for n in range(8)]
        )
        assert {node_of(name) for name in names} == {SECOND_NODE}
        start_all([workload("mig-pod", {MIG: "1"})])
        assert node_of("mig-pod") == NODE_NAME


@pytest.fixture(scope="class")
def dra_on_both() -> Iterator[None]:
    EVENTS.write_text("")
    on_node(2, f": > {SECOND_EVENTS}")
    kubectl("apply", "-k", str(OVERLAY))
    for node, model in ((NODE_NAME, FIRST_MODEL), (SECOND_NODE, SECOND_MODEL)):
        wait_until(f"the driver Ready on {node}", lambda: daemon_ready(DRIVER_LABEL, node), 240)  # noqa: B023
        wait_until(f"{node}'s pool", lambda: pool_of_size(node, devices_of(model)), 120)  # noqa: B023
    product = SECOND_MODEL.gpus[0].name
    apply(claim_template("second-product", "gpu.nvidia.com", product_is(product)))
    apply(claim_template("mig-1g", "mig-1g.10gb.nvidia.com"))
    apply(claim_template("any-gpu", "gpu.nvidia.com"))
    yield
    delete_workloads()
    for name in ("second-product", "mig-1g", "any-gpu"):
        kubectl("delete", "resourceclaimtemplate", "-n", "default", name, check=False)
    kubectl("delete", "-k", str(OVERLAY), "--wait=true", "--timeout=120s", check=False)
    wait_until("no driver pod", lambda: no_daemon_pods(DRIVER_LABEL), timeout=120)
    EVENTS.write_text("")
    on_node(2, f": > {SECOND_EVENTS}")


def published_count(node: str) -> int:
    """How many devices the node's newest pool generation has published (as the scheduler
    counts them while a driver writes)."""
    found = node_slices(node)
    return len(newest_devices(found)) if found else 0


def pool_counter(node: str) -> Callable[[], int]:
    return lambda: published_count(node)


def containers(names: list[str]) -> dict[str, str]:
    """Each pod's container ID: the same after an update means it ran on untouched."""
    return {name: pod(name)["status"]["containerStatuses"][0]["containerID"] for name in names}


def tag_on_both_nodes(image: str) -> str:
    """The same image under a new tag in each node's containerd: what a release would ship."""
    rolled = f"{image}-rolled"
    for node in (FIRST, SECOND):
        address = str(node.containerd_socket)
        ctr = [str(RUN / "bin" / "ctr"), "--address", address, "-n", "k8s.io", "images"]
        subprocess.run([*ctr, "rm", rolled], capture_output=True, check=False)
        subprocess.run([*ctr, "tag", image, rolled], capture_output=True, check=True)
    return rolled


def set_driver_image(image: str) -> None:
    """Roll the DRA DaemonSet to `image` and wait until every node runs it."""
    daemonset = ("-n", "kube-system", "daemonset/deviceplugin-dra")
    kubectl("set", "image", *daemonset, f"dra={image}")
    kubectl("rollout", "status", *daemonset, "--timeout=300s", timeout=320)


def rolled_alone(node: str, image: str) -> Callable[[], bool]:
    """Whether only the driver pod of `image` is left on `node`, and Ready."""

    def alone() -> bool:
        pods = [
            p
            for p in get("pods", "-n", "kube-system", "-l", DRIVER_LABEL)["items"]
            if p["spec"].get("nodeName") == node
        ]
        return (
            len(pods) == 1
            and pods[0]["spec"]["containers"][0]["image"] == image
            and daemon_ready(DRIVER_LABEL, node) is not None
        )

    return alone


def product_is(product: str) -> str:
    return f"device.attributes['gpu.nvidia.com'].productName == '{product}'"


def second_node_token(folder: Path) -> Token:
    """Node 2's driver pod's projected token, where node 2's kubelet wrote it (its own root)."""
    found = daemon_pod(DRIVER_LABEL, SECOND_NODE)
    volumes = f"{KUBELET_ROOT}/pods/{found['metadata']['uid']}/volumes/kubernetes.io~projected"
    return Token(on_node(2, f"cat {volumes}/*/token").strip(), folder)


@pytest.mark.usefixtures("dra_on_both")
class TestDraOnBothNodes:
    def test_a_claims_attributes_pick_the_node_every_time(self) -> None:
        assert SECOND_MODEL.gpus[0].name not in {gpu.name for gpu in FIRST_MODEL.gpus}
        for attempt in range(3):  # the seed's "repeated scheduling lands consistently"
            names = start_all(
                [claim_workload(f"product-{attempt}-{n}", "second-product") for n in range(3)]
                + [claim_workload(f"mig-{attempt}-{n}", "mig-1g") for n in range(3)]
            )
            placed = {name: node_of(name) for name in names}
            for name, node in placed.items():
                assert node == (SECOND_NODE if name.startswith("product") else NODE_NAME), placed
            delete_workloads()

    def test_node_2s_token_is_refused_node_1s_slices(self, tmp_path: Path) -> None:
        token = second_node_token(tmp_path)
        user = token.whoami()
        assert user["username"] == "system:serviceaccount:kube-system:deviceplugin-dra"
        assert user["extra"][NODE_NAME_KEY] == [SECOND_NODE]
        answer = token.kubectl("create", "-f", "-", stdin=slice_manifest("e2e-2n", NODE_NAME))
        refused(answer, SLICE_POLICY, f"the DRA driver on node {SECOND_NODE} may write only")
        before = versions(NODE_NAME)
        victim = next(iter(before))
        answer = token.kubectl("delete", "resourceslice", victim)
        refused(answer, SLICE_POLICY, "may write only the ResourceSlices of that node")
        # and node 1's own token, read on the host's kubelet root, is refused node 2's
        (tmp_path / "first").mkdir()
        first = Token(pod_token(daemon_pod(DRIVER_LABEL, NODE_NAME)), tmp_path / "first")
        answer = first.kubectl("create", "-f", "-", stdin=slice_manifest("e2e-2n", SECOND_NODE))
        refused(answer, SLICE_POLICY, f"the DRA driver on node {NODE_NAME} may write only")
        assert versions(NODE_NAME) == before

    @pytest.mark.parametrize(("restarted", "other"), [(2, 1), (1, 2)], ids=["node-2", "node-1"])
    def test_restarting_one_nodes_driver_or_kubelet_leaves_the_other_alone(
        self, restarted: int, other: int
    ) -> None:
        node, model = (SECOND_NODE, SECOND_MODEL) if restarted == 2 else (NODE_NAME, FIRST_MODEL)
        untouched = NODES[other - 1]
        before = versions(untouched)
        labels = get("node", untouched)["metadata"]["labels"]
        old = daemon_pod(DRIVER_LABEL, node)["metadata"]["name"]
        kubectl("delete", "pod", "-n", "kube-system", old, "--wait=true")
        wait_until(
            f"a new driver Ready on {node}",
            lambda: daemon_ready(DRIVER_LABEL, node) not in (None, old),
            timeout=240,
        )
        size = devices_of(model)
        wait_until(f"{node}'s pool again", lambda: pool_of_size(node, size), 120)
        assert versions(untouched) == before
        cluster("restart", "kubelet" if restarted == 1 else "kubelet-2")
        wait_until(f"{node}'s pool after its kubelet", lambda: pool_of_size(node, size), 240)
        assert versions(untouched) == before
        assert get("node", untouched)["metadata"]["labels"] == labels

    def test_a_rolling_update_of_the_driver_leaves_no_gap_in_either_nodes_slices(self) -> None:
        """Both nodes' drivers replaced one node at a time (surge: the new pod beside the old),
        with a claim prepared on each node: each node's pool stays whole throughout and the
        claims' containers run on untouched."""
        names = start_all(
            [claim_workload("rolled-a10", "second-product"), claim_workload("rolled-mig", "mig-1g")]
        )
        assert {node_of(name) for name in names} == set(NODES)
        before = containers(names)
        sizes = {NODE_NAME: devices_of(FIRST_MODEL), SECOND_NODE: devices_of(SECOND_MODEL)}
        image = daemon_pod(DRIVER_LABEL, NODE_NAME)["spec"]["containers"][0]["image"]
        rolled = tag_on_both_nodes(image)
        with contextlib.ExitStack() as sampling:
            lowest = {node: sampling.enter_context(Lowest(pool_counter(node))) for node in NODES}
            set_driver_image(rolled)
            for node in NODES:
                wait_until(
                    f"the rolled driver alone on {node}",
                    rolled_alone(node, rolled),
                    timeout=120,
                )
            time.sleep(3)  # past the old pods' exit
        assert {node: lowest[node].lowest for node in NODES} == sizes  # no gap on either node
        assert containers(names) == before and all(pod_running(name) for name in names)
        set_driver_image(image)

    def test_an_xid_on_a_node_2_gpu_takes_only_that_gpu_out(self) -> None:
        """Last: the Xid stays in node 2's events file until the class ends."""
        before = versions(NODE_NAME)
        failing = SECOND_MODEL.gpus[0]
        event = json.dumps({"uuid": failing.uuid, "xid": 79})
        on_node(2, f"echo '{event}' >> {SECOND_EVENTS}")
        tainted = served("DRADeviceTaints")

        def only_it_out() -> bool:
            devices = pool(SECOND_NODE) or {}
            health = {
                attribute(d, "uuid"): attribute(d, "nvidia.com/healthy") for d in devices.values()
            }
            others = {g.uuid for g in SECOND_MODEL.gpus} - {failing.uuid}
            gone = health.get(failing.uuid) is False if tainted else failing.uuid not in health
            return gone and all(health.get(uuid) is True for uuid in others)

        wait_until("node 2's failing GPU out, its others in", only_it_out, timeout=60)
        assert versions(NODE_NAME) == before  # node 1's slices untouched
        healthy = len(SECOND_MODEL.gpus) - 1
        names = start_all(
            [claim_workload(f"after-xid-{n}", "second-product") for n in range(healthy)]
        )
        assert {node_of(name) for name in names} == {SECOND_NODE}
        apply(claim_workload("one-more", "second-product"))  # node 2's healthy GPUs all taken
        reason = wait_until("one-more unschedulable", lambda: unschedulable_reason("one-more"))
        assert "cannot allocate all claims" in reason, reason
        start_all([claim_workload("elsewhere", "any-gpu")])  # a GPU of any product: node 1's
        assert node_of("elsewhere") == NODE_NAME
