"""A rolling update of each DaemonSet with work running: the same image under a new tag, rolled
out with `kubectl set image` as an operator upgrades. The DaemonSets surge (`maxSurge: 1,
maxUnavailable: 0`): the new pod registers beside the old one, each on its own socket, before
the old one goes. Checked through the API and the node: no workload restarts, no claim is
unprepared or prepared again, the node's allocatable (device plugin) and published devices
(DRA) never drop below what the running pods hold, and new pods schedule afterwards.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from e2e.cluster.kube import (
    REPO,
    RUN,
    apply,
    daemon_pod,
    delete_workloads,
    extended,
    get,
    kubectl,
    pod,
    pod_running,
    wait_until,
    workload_pod,
)
from e2e.cluster.test_dra import (
    CDI_DIR,
    CHECKPOINT,
    DRIVER_LABEL,
    SEED_DEVICE_CLASS,
    SEED_TEMPLATE,
    claim_pod,
    claim_uid,
    delete_dra_workloads,
    published,
)
from e2e.cluster.test_dra import (
    OVERLAY as DRA_OVERLAY,
)

PLUGIN_OVERLAY = REPO / "manifests" / "overlays" / "simulated-node"
PLUGIN_LABEL = "app.kubernetes.io/name=deviceplugin"
CONTAINERD = Path("/run/deviceplugin-e2e-cluster/containerd.sock")
SYSTEM = ("-n", "kube-system")
GPU, MIG = "nvidia.com/gpu", "nvidia.com/mig-1g.10gb"


def retag(image: str) -> str:
    """The same image under a new tag in the node's containerd: what a release would ship."""
    rolled = f"{image}-rolled"
    ctr = [str(RUN / "bin" / "ctr"), "--address", str(CONTAINERD), "-n", "k8s.io"]
    subprocess.run([*ctr, "images", "rm", rolled], capture_output=True, check=False)
    subprocess.run([*ctr, "images", "tag", image, rolled], capture_output=True, check=True)
    return rolled


class Lowest:
    """Samples a number every 0.2 s in a thread while a rollout runs; keeps the lowest."""

    def __init__(self, sample: Callable[[], int]) -> None:
        self.sample = sample
        self.lowest: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            value = self.sample()
            self.lowest = value if self.lowest is None else min(self.lowest, value)
            time.sleep(0.2)

    def __enter__(self) -> Lowest:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def workloads(names: list[str]) -> dict[str, tuple[str, str, int]]:
    """Each pod's UID, container ID and restart count."""
    found = {}
    for name in names:
        status = pod(name)["status"]["containerStatuses"][0]
        found[name] = (pod(name)["metadata"]["uid"], status["containerID"], status["restartCount"])
    return found


def roll(daemonset: str, container: str, label: str) -> str:
    """Set the DaemonSet's image to its retagged twin and wait until the new pod alone runs."""
    old = daemon_pod(label)
    image = old["spec"]["containers"][0]["image"]
    rolled = retag(image)
    kubectl("set", "image", *SYSTEM, f"daemonset/{daemonset}", f"{container}={rolled}")
    kubectl("rollout", "status", *SYSTEM, f"daemonset/{daemonset}", "--timeout=240s", timeout=260)

    def only_the_new_one() -> str | None:
        pods = get("pods", *SYSTEM, "-l", label)["items"]
        names = [p["metadata"]["name"] for p in pods]
        images = {p["spec"]["containers"][0]["image"] for p in pods}
        done = old["metadata"]["name"] not in names and images == {rolled}
        return str(names[0]) if done and len(names) == 1 else None

    return wait_until("the old pod gone, the new one alone", only_the_new_one, timeout=120)


def start_all(manifests: list[dict[str, object]]) -> list[str]:
    names = [str(m["metadata"]["name"]) for m in manifests]  # type: ignore[index]
    for manifest in manifests:
        apply(manifest)
    for name in names:
        wait_until(f"pod {name} Running", lambda: pod_running(name), timeout=180)  # noqa: B023
    return names


@pytest.fixture
def device_plugin() -> Iterator[None]:
    kubectl("apply", "-k", str(PLUGIN_OVERLAY))
    wait_until("the plugin's GPUs", lambda: extended(GPU) == 8 or None, timeout=240)
    yield
    delete_workloads()
    kubectl("delete", "-k", str(PLUGIN_OVERLAY), "--wait=true", "--timeout=120s", check=False)
    wait_until("no GPU allocatable", lambda: extended(GPU) == 0 or None, timeout=180)


def test_device_plugin_rolls_to_a_new_image_under_running_pods(device_plugin: None) -> None:
    names = start_all(
        [
            workload_pod("rolled-gpu-0", {GPU: "1"}),
            workload_pod("rolled-gpu-1", {GPU: "1"}),
            workload_pod("rolled-mig", {MIG: "1"}),
        ]
    )
    before = workloads(names)
    with Lowest(lambda: extended(GPU)) as gpus, Lowest(lambda: extended(MIG)) as migs:
        roll("deviceplugin", "deviceplugin", PLUGIN_LABEL)
        time.sleep(3)  # past the old pod's exit: its endpoint gone from the kubelet
    assert workloads(names) == before  # the same pods and containers, not restarted
    assert all(pod_running(name) for name in names)
    assert gpus.lowest is not None and gpus.lowest >= 2, gpus.lowest  # what the pods hold
    assert migs.lowest is not None and migs.lowest >= 1, migs.lowest
    print(f"lowest allocatable during the update: {GPU} {gpus.lowest}/8, {MIG} {migs.lowest}/28")
    start_all([workload_pod("after-the-update", {GPU: "1"})])


@pytest.fixture
def dra_driver() -> Iterator[None]:
    kubectl("apply", "-k", str(DRA_OVERLAY))
    wait_until("the node's slices", lambda: len(published()) == 32 or None, timeout=240)
    apply(SEED_DEVICE_CLASS)
    apply(SEED_TEMPLATE)
    yield
    delete_dra_workloads()
    kubectl("delete", "-k", str(DRA_OVERLAY), "--wait=true", "--timeout=120s", check=False)


def prepared_state(uids: list[str]) -> dict[str, tuple[object, int, int]]:
    """For each claim: its checkpoint entry and its CDI spec file's inode and mtime, which a
    second Prepare or an Unprepare would change."""
    claims = json.loads(CHECKPOINT.read_text())["data"]["claims"]
    state: dict[str, tuple[object, int, int]] = {}
    for uid in uids:
        spec = (CDI_DIR / f"k8s.gpu.nvidia.com-claim_{uid}.json").stat()
        state[uid] = (claims.get(uid), spec.st_ino, spec.st_mtime_ns)
    return state


def test_dra_driver_rolls_to_a_new_image_under_prepared_claims(dra_driver: None) -> None:
    names = start_all(
        [claim_pod("rolled-claim-0", "mig-slice"), claim_pod("rolled-claim-1", "mig-slice")]
    )
    uids = [claim_uid(name) for name in names]
    before, prepared = workloads(names), prepared_state(uids)
    assert all(entry is not None for entry, _, _ in prepared.values())
    with Lowest(lambda: len(published())) as devices:
        roll("deviceplugin-dra", "dra", DRIVER_LABEL)
        time.sleep(3)
    assert workloads(names) == before
    assert prepared_state(uids) == prepared  # neither unprepared nor prepared again
    assert devices.lowest == 32, devices.lowest  # the slices stayed published throughout
    start_all([claim_pod("claim-after-the-update", "mig-slice")])
