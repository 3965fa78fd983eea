"""The real cluster as the scenarios see it: kubectl with the cluster's kubeconfig, the API's
objects as JSON, and waits on conditions (never on fixed times)."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
RUN = HERE / "run"
KUBECONFIG = RUN / "kubeconfig"
KUBECTL = RUN / "bin" / "kubectl"
CLUSTER = HERE / "cluster"
NODE_NAME = "deviceplugin-e2e"
SECOND_NODE = f"{NODE_NAME}-2"  # with `NODES=2` (e2e/cluster/topology.py)
SIMULATED_NODE = Path("/var/lib/deviceplugin-sim")
EVENTS = SIMULATED_NODE / "events.jsonl"
WORKLOAD_IMAGE = os.environ.get("E2E_WORKLOAD_IMAGE", "localhost/deviceplugin-e2e-busybox:latest")

Obj = dict[str, Any]
T = TypeVar("T")


class KubectlError(Exception):
    pass


def kubectl(*args: str, stdin: str | None = None, check: bool = True, timeout: float = 120) -> str:
    done = subprocess.run(
        [str(KUBECTL), f"--kubeconfig={KUBECONFIG}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and done.returncode != 0:
        raise KubectlError(f"kubectl {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout if done.returncode == 0 else done.stdout + done.stderr


@functools.cache
def helm_binary() -> Path:
    """Helm as e2e/helm/build.sh builds it (once; cached outside the clone)."""
    done = subprocess.run(
        [str(REPO / "e2e" / "helm" / "build.sh")], stdout=subprocess.PIPE, text=True, check=True
    )
    return Path(done.stdout.strip().splitlines()[-1])


def helm(*args: str, namespace: str = "kube-system") -> str:
    done = subprocess.run(
        [str(helm_binary()), f"--kubeconfig={KUBECONFIG}", "--namespace", namespace, *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"helm {' '.join(args)}: {done.stderr}"
    return done.stdout


def get(*args: str) -> Obj:
    result: Obj = json.loads(kubectl("get", "-o", "json", *args))
    return result


def apply(manifest: Obj | str) -> None:
    text = manifest if isinstance(manifest, str) else json.dumps(manifest)
    kubectl("apply", "-f", "-", stdin=text)


def wait_until(what: str, probe: Callable[[], T | None], timeout: float = 120) -> T:
    """Poll `probe` until it returns something truthy; fail naming `what` and the last answer."""
    deadline = time.monotonic() + timeout
    last: T | Exception | None = None
    while True:
        try:
            last = probe()
        except (KubectlError, KeyError, IndexError, ValueError) as exc:
            last = exc
        else:
            if last:
                return last
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not after {timeout:.0f} s (last: {last!r})")
        time.sleep(1)


def allocatable(node: str = NODE_NAME) -> dict[str, str]:
    found = get("node", node)
    return dict(found["status"]["allocatable"])


def extended(resource: str, node: str = NODE_NAME) -> int:
    return int(allocatable(node).get(resource, "0"))


def pod(name: str, namespace: str = "default") -> Obj:
    return get("pod", name, "-n", namespace)


def pod_running(name: str, namespace: str = "default") -> bool:
    status = pod(name, namespace)["status"]
    return status.get("phase") == "Running" and all(
        c.get("ready") for c in status.get("containerStatuses", [])
    )


def workload_pod(name: str, limits: dict[str, str]) -> Obj:
    """A busybox pod that sleeps, asking `limits`, from the locally imported image."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"e2e": "workload"}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "work",
                    "image": WORKLOAD_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["sleep", "3600"],
                    "resources": {"limits": limits},
                }
            ],
        },
    }


def delete_workloads() -> None:
    kubectl("delete", "pod", "-n", "default", "-l", "e2e=workload", "--wait=true", "--timeout=120s")


def _daemon_pods(label: str, node: str | None = None) -> list[Obj]:
    where = [f"--field-selector=spec.nodeName={node}"] if node else []
    pods: list[Obj] = get("pods", "-n", "kube-system", "-l", label, *where)["items"]
    return pods


def daemon_pod(label: str, node: str | None = None) -> Obj:
    """The one pod of a DaemonSet in kube-system, by its label selector (on `node`, where the
    cluster has more than one); a pod being deleted (a DaemonSet's pod outliving its deleted
    DaemonSet for a while) is not it."""
    pods = [p for p in _daemon_pods(label, node) if not p["metadata"].get("deletionTimestamp")]
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    found: Obj = pods[0]
    return found


def daemon_ready(label: str, node: str | None = None) -> str | None:
    """The DaemonSet pod's name (on `node`) once all its containers are Ready, and no earlier pod
    of that label is still stopping beside it (two drivers of one name would share its
    sockets)."""
    pods = _daemon_pods(label, node)
    if len(pods) != 1 or pods[0]["metadata"].get("deletionTimestamp"):
        return None
    found = pods[0]
    statuses = found["status"].get("containerStatuses", [])
    ready = statuses and all(s["ready"] for s in statuses)
    return str(found["metadata"]["name"]) if ready else None


def replace_daemon_pod(label: str) -> None:
    """Delete the DaemonSet's pod and wait until the one the DaemonSet makes instead is Ready."""
    old = daemon_pod(label)["metadata"]["uid"]
    kubectl("delete", "pod", "-n", "kube-system", "-l", label, "--wait=true")
    wait_until(
        f"a new {label} pod Ready",
        lambda: daemon_ready(label) and daemon_pod(label)["metadata"]["uid"] != old,
        timeout=240,
    )


def unschedulable_reason(name: str) -> str | None:
    """The scheduler's message on a pod it could not place, once it has written one."""
    conditions = pod(name)["status"].get("conditions", [])
    return next(
        (
            str(c.get("message", ""))
            for c in conditions
            if c["type"] == "PodScheduled" and c["status"] == "False"
        ),
        None,
    )


def exec_in(name: str, *command: str, namespace: str = "default") -> str:
    return kubectl("exec", "-n", namespace, name, "--", *command)


def cluster(*args: str) -> None:
    subprocess.run([str(CLUSTER), *args], check=True, timeout=600)


def on_node(number: int, command: str) -> str:
    """A shell command run in node `number`'s view of the host (`cluster exec`): its output."""
    done = subprocess.run(
        [str(CLUSTER), "exec", str(number), "--", "sh", "-c", command],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, f"cluster exec {number} -- {command}: {done.stderr}"
    return done.stdout


def append_event(event: Obj) -> None:
    with open(EVENTS, "a") as stream:
        stream.write(json.dumps(event) + "\n")
