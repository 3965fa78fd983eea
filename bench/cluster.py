"""`sudo make bench-cluster`: the real scheduler at scale, on the real cluster (docs/cluster.md).

Two phases in one run, each measured from the API server's own answers (the create call's
return, then a watch event), never from the plugin's reports:

1. the device plugin on the real node (seed ConfigMap with 50 replicas per GPU: 200
   `nvidia.com/gpu`): 200 pods asking `nvidia.com/gpu: 1`, time from creation to bound;
2. the DRA driver on 20 nodes: the real one plus 19 Node objects whose ResourceSlices come from
   `deviceplugin dra serve` processes that publish only (their kubelet root is an empty folder
   no kubelet watches); this bench keeps those nodes Ready with status and Lease heartbeats, as
   kwok does, and nothing runs there. 200 claims of one MIG 1g.10gb device each (the seed's
   class), each with a pod that holds it: time from the claim's creation to its allocation;
3. the same with NVIDIA's class `mig.nvidia.com`, once on our slices and once on NVIDIA's: its
   DRA kubelet plugin (e2e/reference) on the real node, copies of its slices for the 19 others.
   Whether the shape of our slices costs the scheduler anything.

Reports claims/s and p50/p99 of each, the device plugin's figures as the DRA figures' baseline,
and NVIDIA's slices as the baseline of ours under the same class.
Needs root and a cluster that is up (`sudo make cluster`); cleans up after itself.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.report import Figure, median, p99, table, write_json
from testbed import plugins

REPO = Path(__file__).resolve().parent.parent
RUN = REPO / "e2e" / "cluster" / "run"
PKI = RUN / "pki"
KUBECTL = RUN / "bin" / "kubectl"
RESULTS = Path(__file__).parent / "results-cluster.json"
NAMESPACE = "bench"
COUNT = 200
FAKE_NODES = 19
HEARTBEAT_SECONDS = 10.0
PRESET = "a100-80gb-x8-mixed"
SEED_CLASS = "mig-1g.10gb.nvidia.com"
ANY_MIG_CLASS = "mig.nvidia.com"  # NVIDIA's class: selects on the attributes both drivers publish
DRIVER = "gpu.nvidia.com"
REAL_NODE = "deviceplugin-e2e"
OVERLAYS = REPO / "manifests" / "overlays"
WORKLOAD_IMAGE = "localhost/deviceplugin-e2e-busybox:latest"

Obj = dict[str, Any]


class Api:
    """The API server over loopback with the admin client certificate: one connection per
    caller, so the watch threads and the creating loop never share one."""

    def __init__(self) -> None:
        self.context = ssl.create_default_context(cafile=str(PKI / "ca.crt"))
        self.context.load_cert_chain(str(PKI / "admin.crt"), str(PKI / "admin.key"))

    def connect(self) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection("127.0.0.1", 6443, context=self.context, timeout=60)

    def call(
        self,
        method: str,
        path: str,
        body: Obj | None = None,
        content_type: str = "application/json",
    ) -> Obj:
        conn = self.connect()
        try:
            data = json.dumps(body).encode() if body is not None else None
            conn.request(method, path, body=data, headers={"Content-Type": content_type})
            answer = conn.getresponse()
            text = answer.read()
            if answer.status >= 300 and not (method == "DELETE" and answer.status == 404):
                raise RuntimeError(f"{method} {path}: {answer.status} {text[:300]!r}")
            result: Obj = json.loads(text) if text else {}
            return result
        finally:
            conn.close()

    def watch(self, path: str, on_event: Callable[[Obj], None], stop: threading.Event) -> None:
        """Calls `on_event` with each watch event's object until `stop` is set."""
        conn = self.connect()
        conn.request("GET", f"{path}?watch=1&allowWatchBookmarks=false")
        answer = conn.getresponse()
        while not stop.is_set():
            line = answer.readline()
            if not line:
                break
            on_event(json.loads(line)["object"])
        conn.close()


def kubectl(*args: str, stdin: str | None = None) -> str:
    return subprocess.run(
        [str(KUBECTL), f"--kubeconfig={RUN / 'kubeconfig'}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout


def wait_for(what: str, ready: Callable[[], bool], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not after {timeout:.0f} s")
        time.sleep(1)


def allocatable(api: Api, resource: str) -> int:
    node = api.call("GET", "/api/v1/nodes/deviceplugin-e2e")
    return int(node["status"]["allocatable"].get(resource, "0"))


def pod(name: str, extra: Obj) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "work",
                    "image": WORKLOAD_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["sleep", "3600"],
                    **extra,
                }
            ],
        },
    }


def measure(
    api: Api, watch_path: str, done: Callable[[Obj], bool], create: Callable[[int], object]
) -> tuple[list[float], float]:
    """Creates COUNT objects with `create(i)` while watching `watch_path`; returns each one's
    seconds from its creation call returning to `done` first being seen, and the span from the
    first creation to the last completion."""
    created: dict[str, float] = {}
    finished: dict[str, float] = {}
    stop = threading.Event()

    def seen(obj: Obj) -> None:
        name = obj["metadata"]["name"]
        if name not in finished and done(obj):
            finished[name] = time.monotonic()

    watcher = threading.Thread(target=api.watch, args=(watch_path, seen, stop), daemon=True)
    watcher.start()
    time.sleep(0.5)
    first = time.monotonic()
    for i in range(COUNT):
        create(i)
        created[f"b-{i}"] = time.monotonic()
    wait_for("every object done", lambda: len(finished) >= COUNT, timeout=600)
    stop.set()
    latencies = [max(0.0, finished[n] - created[n]) for n in created]
    return latencies, max(finished.values()) - first


def device_plugin_phase(api: Api) -> tuple[list[float], float]:
    configmap = (REPO / "manifests" / "config" / "configmap.yaml").read_text()
    kubectl("apply", "-k", str(OVERLAYS / "simulated-node"))
    kubectl("apply", "-f", "-", stdin=configmap.replace("replicas: 2", "replicas: 50"))
    wait_for(
        "200 nvidia.com/gpu allocatable",
        lambda: allocatable(api, "nvidia.com/gpu") == COUNT,
        timeout=300,
    )
    path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    try:
        return measure(
            api,
            path,
            lambda obj: bool(obj["spec"].get("nodeName")),
            lambda i: api.call(
                "POST", path, pod(f"b-{i}", {"resources": {"limits": {"nvidia.com/gpu": "1"}}})
            ),
        )
    finally:
        kubectl(
            "delete", "pods", "-n", NAMESPACE, "--all", "--grace-period=0", "--force", "--wait=true"
        )
        kubectl("delete", "-k", str(OVERLAYS / "simulated-node"), "--wait=true")


Publish = Callable[[Api, list[str], Path], list["subprocess.Popen[bytes]"]]


@contextlib.contextmanager
def fake_nodes(api: Api, publish: Publish) -> Iterator[list[str]]:
    """FAKE_NODES Ready nodes with a heartbeat thread, whose slices `publish` puts there."""
    names = [f"bench-node-{i:02d}" for i in range(FAKE_NODES)]
    roots = Path(tempfile.mkdtemp(prefix="dp-bench-cluster-"))
    stop = threading.Event()
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for name in names:
            api.call(
                "POST",
                "/api/v1/nodes",
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
                },
            )
        heartbeat(api, names)
        beat = threading.Thread(target=keep_beating, args=(api, names, stop), daemon=True)
        beat.start()
        processes = publish(api, names, roots)
        yield names
    finally:
        stop.set()
        for process in processes:
            process.terminate()
        for process in processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=20)
        for name in names:
            kubectl(
                "delete", "resourceslices", f"--field-selector=spec.nodeName={name}", "--wait=false"
            )
            api.call("DELETE", f"/api/v1/nodes/{name}")
            api.call(
                "DELETE", f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}"
            )
        shutil.rmtree(roots, ignore_errors=True)


def our_publishers(api: Api, names: list[str], roots: Path) -> list[subprocess.Popen[bytes]]:
    """A `deviceplugin dra serve` per node that publishes only (its kubelet root is an empty
    folder no kubelet watches)."""
    processes = []
    for name in names:
        (roots / name).mkdir()
        processes.append(
            subprocess.Popen(
                [
                    str(REPO / ".venv" / "bin" / "deviceplugin"),
                    "dra",
                    "serve",
                    "--simulate",
                    PRESET,
                    "--node-name",
                    name,
                    "--kubeconfig",
                    str(RUN / "admin.kubeconfig"),
                    "--kubelet-root",
                    str(roots / name),
                    "--log-format",
                    "json",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
    return processes


def nvidia_slices_for(real_node_slices: list[Obj]) -> Publish:
    """Copies of the slices NVIDIA's driver published for the real node, one pool per fake
    node: the same devices, attributes and capacities, as its driver would publish there."""

    def publish(api: Api, names: list[str], roots: Path) -> list[subprocess.Popen[bytes]]:
        for name in names:
            for original in real_node_slices:
                spec = json.loads(json.dumps(original["spec"]))
                spec["nodeName"] = name
                spec["pool"]["name"] = name
                api.call(
                    "POST",
                    "/apis/resource.k8s.io/v1/resourceslices",
                    {
                        "apiVersion": "resource.k8s.io/v1",
                        "kind": "ResourceSlice",
                        "metadata": {"generateName": f"{name}-{DRIVER}-"},
                        "spec": spec,
                    },
                )
        return []

    return publish


def heartbeat(api: Api, names: list[str]) -> None:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    micro = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    for name in names:
        api.call(
            "PATCH",
            f"/api/v1/nodes/{name}/status",
            {
                "status": {
                    "capacity": {"cpu": "64", "memory": "512Gi", "pods": "110"},
                    "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"},
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "True",
                            "reason": "BenchHeartbeat",
                            "message": "kept Ready by bench/cluster.py",
                            "lastHeartbeatTime": now,
                            "lastTransitionTime": now,
                        }
                    ],
                }
            },
            content_type="application/strategic-merge-patch+json",
        )
        lease = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}"
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name, "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": micro},
        }
        try:
            api.call(
                "PATCH", lease, {"spec": body["spec"]}, content_type="application/merge-patch+json"
            )
        except RuntimeError:
            api.call("POST", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases", body)


def keep_beating(api: Api, names: list[str], stop: threading.Event) -> None:
    while not stop.wait(HEARTBEAT_SECONDS):
        with contextlib.suppress(RuntimeError, OSError):
            heartbeat(api, names)


def slices_published(api: Api, nodes: int) -> bool:
    found = api.call("GET", "/apis/resource.k8s.io/v1/resourceslices")["items"]
    return len({s["spec"].get("nodeName") for s in found}) >= nodes


@contextlib.contextmanager
def our_driver(api: Api) -> Iterator[Publish]:
    """Our DRA driver on the real node (the overlay), ours publishing for the fake nodes."""
    kubectl("apply", "-k", str(OVERLAYS / "simulated-node-dra"))
    try:
        yield our_publishers
    finally:
        kubectl("delete", "-k", str(OVERLAYS / "simulated-node-dra"), "--wait=true")


@contextlib.contextmanager
def nvidia_driver(api: Api) -> Iterator[Publish]:
    """NVIDIA's DRA kubelet plugin on the real node (e2e/reference), copies of its slices for
    the fake nodes; NVIDIA's DeviceClasses as our manifests ship them."""
    kubectl("apply", "-f", str(REPO / "manifests" / "dra" / "deviceclasses.yaml"))
    binaries = plugins.reference_binaries()
    plugins.hand_over_dra_checkpoint()
    log = RUN / "logs" / "nvidia-dra-driver-bench.log"
    root = Path("/var/lib/deviceplugin-sim/root")
    driver = plugins.dra_driver(
        binaries, root, RUN / "kubeconfig", REAL_NODE, Path("/var/run/cdi"), log
    )
    with driver.start():
        wait_for("NVIDIA's slices on the real node", lambda: bool(real_node_slices(api)))
        yield nvidia_slices_for(real_node_slices(api))
    kubectl("delete", "resourceslices", f"--field-selector=spec.driver={DRIVER}", "--wait=false")


def real_node_slices(api: Api) -> list[Obj]:
    found: list[Obj] = api.call("GET", "/apis/resource.k8s.io/v1/resourceslices")["items"]
    return [s for s in found if s["spec"].get("nodeName") == REAL_NODE]


def dra_phase(
    api: Api,
    driver: Callable[[Api], contextlib.AbstractContextManager[Publish]],
    device_class: str,
) -> tuple[list[float], float]:
    claims = f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims"
    pods = f"/api/v1/namespaces/{NAMESPACE}/pods"

    def create(i: int) -> None:
        api.call(
            "POST",
            claims,
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": f"b-{i}", "namespace": NAMESPACE},
                "spec": {
                    "devices": {
                        "requests": [
                            {
                                "name": "slice",
                                "exactly": {"deviceClassName": device_class, "count": 1},
                            }
                        ]
                    }
                },
            },
        )
        manifest = pod(f"b-{i}", {"resources": {"claims": [{"name": "gpu"}]}})
        manifest["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": f"b-{i}"}]
        api.call("POST", pods, manifest)

    try:
        with driver(api) as publish, fake_nodes(api, publish):
            wait_for("slices of 20 nodes", lambda: slices_published(api, FAKE_NODES + 1))
            return measure(
                api, claims, lambda obj: bool(obj.get("status", {}).get("allocation")), create
            )
    finally:
        kubectl(
            "delete",
            "pods",
            "-n",
            NAMESPACE,
            "--all",
            "--grace-period=0",
            "--force",
            "--wait=false",
        )
        kubectl("delete", "resourceclaims", "-n", NAMESPACE, "--all", "--wait=true")


Phase = tuple[list[float], float]  # each claim's seconds to allocated, and the whole span


def figures(dra: Phase, plugin: Phase, ours_any: Phase, nvidia_any: Phase) -> list[Figure]:
    (dra_lat, dra_span), (dp_lat, dp_span) = dra, plugin
    label = "(200 pods, nvidia.com/gpu: 1, device plugin, real node)"
    shape = f"NVIDIA's slices, same class and nodes ({ANY_MIG_CLASS})"
    return [
        Figure(
            "DRA, 20 nodes: claims allocated per second",
            COUNT / dra_span,
            "/s",
            baseline=COUNT / dp_span,
            baseline_label=f"pods bound per second {label}",
        ),
        Figure(
            "DRA, 20 nodes: claim created → allocated, p50",
            median(dra_lat) * 1000,
            "ms",
            baseline=median(dp_lat) * 1000,
            baseline_label=f"pod created → bound {label}",
            samples=dra_lat,
        ),
        Figure(
            "DRA, 20 nodes: claim created → allocated, p99",
            p99(dra_lat) * 1000,
            "ms",
            baseline=p99(dp_lat) * 1000,
            baseline_label=f"pod created → bound {label}",
        ),
        Figure(
            f"DRA, 20 nodes, our slices, {ANY_MIG_CLASS}: claims allocated per second",
            COUNT / ours_any[1],
            "/s",
            baseline=COUNT / nvidia_any[1],
            baseline_label=shape,
        ),
        Figure(
            f"DRA, 20 nodes, our slices, {ANY_MIG_CLASS}: claim created → allocated, p50",
            median(ours_any[0]) * 1000,
            "ms",
            baseline=median(nvidia_any[0]) * 1000,
            baseline_label=shape,
            samples=ours_any[0],
        ),
    ]


def main() -> int:
    if os.geteuid() != 0 or not (RUN / "kubeconfig").exists():
        print(
            "bench.cluster: needs root and a running cluster (sudo make cluster)", file=sys.stderr
        )
        return 2
    api = Api()
    with contextlib.suppress(subprocess.CalledProcessError):
        kubectl("create", "namespace", NAMESPACE)
    wait_for(
        "the bench namespace's service account",
        lambda: bool(
            kubectl("get", "serviceaccount", "default", "-n", NAMESPACE, "--ignore-not-found")
        ),
    )
    print("bench.cluster: device plugin, 200 pods ...", file=sys.stderr, flush=True)
    plugin = device_plugin_phase(api)
    print("bench.cluster: DRA, 20 nodes, 200 claims ...", file=sys.stderr, flush=True)
    dra = dra_phase(api, our_driver, SEED_CLASS)
    print(f"bench.cluster: DRA, our slices, {ANY_MIG_CLASS} ...", file=sys.stderr, flush=True)
    ours_any = dra_phase(api, our_driver, ANY_MIG_CLASS)
    print("bench.cluster: DRA, NVIDIA's slices ...", file=sys.stderr, flush=True)
    nvidia_any = dra_phase(api, nvidia_driver, ANY_MIG_CLASS)
    result = figures(dra, plugin, ours_any, nvidia_any)
    print(table(result))
    write_json(RESULTS, result, {"nodes": FAKE_NODES + 1, "count": COUNT})
    kubectl("delete", "namespace", NAMESPACE, "--wait=false")
    return 0


if __name__ == "__main__":
    sys.exit(main())
