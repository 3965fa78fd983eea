"""The README's quick start and its move to DRA, command for command, on the real kubelet,
scheduler and API server (`make e2e-cluster`).

Each block the README marks `<!-- readme-test: cluster NAME -->` runs as written, in bash with
`-e -o pipefail`, from a folder holding a link to the clone's manifests/ and `site.yaml`, the
values file the README asks the reader to write: here the images built for the cluster and the
simulated node's driver root, as e2e/cluster/values-simulated-node.yaml gives them to the device
plugin. `NODE` is the cluster's node; kubectl and helm are the cluster's, first on PATH, with its
kubeconfig in KUBECONFIG. The smoke pods' `busybox:1.36` is the local workload image under that
name in the node's containerd, so nothing is pulled. The README's three installs run in turn,
each checked, smoke-tested and uninstalled; the last, both daemons chosen by node label, moves
the node to DRA and back. Scenarios run in file order.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from e2e.cluster.kube import (
    KUBECONFIG,
    KUBECTL,
    NODE_NAME,
    REPO,
    RUN,
    WORKLOAD_IMAGE,
    daemon_pod,
    daemon_ready,
    extended,
    get,
    helm,
    helm_binary,
    kubectl,
    wait_until,
)
from e2e.cluster.layout import CONTAINERD_SOCKET
from e2e.cluster.served import served
from e2e.cluster.test_dra import prepared_in_checkpoint
from testbed.readme import cluster_block, command_blocks

# Every cluster block of the README, in the order a reader meets them.
BLOCKS = (
    "label-gpu-node",
    "install-plugin",
    "install-dra",
    "install-both",
    "check-plugin",
    "check-dra",
    "smoke-plugin",
    "smoke-dra",
    "uninstall",
    "to-dra",
    "back-to-plugin",
    "unlabel",
)
RELEASE = "gpu"
GPU = "nvidia.com/gpu"
DRIVER = "gpu.nvidia.com"
MODE_LABEL = "nvidia.com/dra"
PLUGIN_LABEL = f"app.kubernetes.io/name=deviceplugin,app.kubernetes.io/instance={RELEASE}"
DRIVER_LABEL = f"app.kubernetes.io/name=deviceplugin-dra,app.kubernetes.io/instance={RELEASE}"
SMOKE_IMAGE = "docker.io/library/busybox:1.36"  # what `image: busybox:1.36` names
EXTENDED_CLASSES = REPO / "manifests" / "dra" / "deviceclasses-extended-resources.yaml"
SIMULATED_VALUES = REPO / "e2e" / "cluster" / "values-simulated-node.yaml"
DEVICE_NODE = re.compile(r"^/dev/nvidia\d+$", re.M)


def image_values(variable: str, default: str) -> dict[str, str]:
    """The chart's image values for one of the images `make cluster-images` built."""
    repository, tag = os.environ.get(variable, default).rsplit(":", 1)
    return {"repository": repository, "tag": tag, "pullPolicy": "Never"}


def site_values() -> dict[str, object]:
    """The reader's site.yaml for this cluster: its images and its (simulated) driver root."""
    values: dict[str, object] = yaml.safe_load(SIMULATED_VALUES.read_text())
    values["image"] = image_values("E2E_IMAGE", "localhost/deviceplugin:e2e")
    values["dra"] = {"image": image_values("E2E_DRA_IMAGE", "localhost/deviceplugin:e2e-dra")}
    return values


@pytest.fixture(scope="module")
def reader() -> Path:
    """The reader's folder: the clone's manifests and their own site.yaml."""
    folder = Path(tempfile.mkdtemp(prefix="readme-quickstart-"))
    (folder / "manifests").symlink_to(REPO / "manifests")
    (folder / "site.yaml").write_text(yaml.safe_dump(site_values()))
    tools = folder / "bin"
    tools.mkdir()
    (tools / "kubectl").symlink_to(KUBECTL)
    (tools / "helm").symlink_to(helm_binary())
    return folder


def run_block(reader: Path, name: str) -> str:
    """Run the README's block `name` as a reader would; its output (stdout and stderr)."""
    code = cluster_block(name).code
    env = {
        **os.environ,
        "PATH": f"{reader / 'bin'}:{os.environ['PATH']}",
        "KUBECONFIG": str(KUBECONFIG),
        "NODE": NODE_NAME,
    }
    done = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", code],
        cwd=reader,
        env=env,
        capture_output=True,
        text=True,
        timeout=420,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"README block {name} exited {done.returncode}:\n{output}"
    return output


def ctr(*args: str, check: bool = True) -> None:
    command = [str(RUN / "bin" / "ctr"), "--address", str(CONTAINERD_SOCKET), "-n", "k8s.io"]
    subprocess.run([*command, *args], capture_output=True, check=check, timeout=60)


def mode_label() -> str | None:
    labels: dict[str, str] = get("node", NODE_NAME)["metadata"].get("labels", {})
    return labels.get(MODE_LABEL)


def no_pods(label: str) -> bool:
    return not get("pods", "-n", "kube-system", "-l", label)["items"]


def slices_published() -> bool:
    found = get("resourceslices", f"--field-selector=spec.nodeName={NODE_NAME}")["items"]
    return any(s["spec"]["driver"] == DRIVER and s["spec"].get("devices") for s in found)


def release_gone() -> None:
    """Once the README's uninstall ran: nothing of the release is left running."""
    wait_until(
        "the release's pods gone", lambda: no_pods(f"app.kubernetes.io/instance={RELEASE}"), 180
    )
    assert RELEASE not in helm("list", "--short").split()


def plugin_serving() -> None:
    wait_until("the device plugin's pod Ready", lambda: daemon_ready(PLUGIN_LABEL), timeout=240)
    wait_until(f"{GPU} allocatable", lambda: extended(GPU) > 0, timeout=120)


def driver_serving() -> None:
    wait_until("the DRA driver's pod Ready", lambda: daemon_ready(DRIVER_LABEL), timeout=240)
    wait_until("the node's slices published", slices_published, timeout=120)


def check_plugin(reader: Path) -> None:
    assert f'"{GPU}"' in run_block(reader, "check-plugin")


def check_dra(reader: Path) -> None:
    output = run_block(reader, "check-dra")
    assert DRIVER in output and NODE_NAME in output, output


def smoke(reader: Path, name: str) -> None:
    """The smoke block's pod listed a GPU's device node (`ls` exits 0 only if there is one)."""
    output = run_block(reader, name)
    assert DEVICE_NODE.search(output), output


@pytest.fixture(scope="module", autouse=True)
def cluster_state(reader: Path) -> Iterator[None]:
    """busybox:1.36 for the smoke pods; afterwards nothing of the README's left on the cluster."""
    ctr("images", "rm", SMOKE_IMAGE, check=False)
    ctr("images", "tag", WORKLOAD_IMAGE, SMOKE_IMAGE)
    yield
    if RELEASE in helm("list", "--short").split():  # a scenario failed before uninstalling
        helm("uninstall", RELEASE, "--wait", "--timeout", "120s")
    for kind, name in (
        ("pod", "gpu-smoke"),
        ("pod", "gpu-claim-smoke"),
        ("resourceclaimtemplate", "one-gpu"),
    ):
        kubectl(
            "delete",
            kind,
            name,
            "-n",
            "default",
            "--ignore-not-found",
            "--wait=true",
            "--timeout=120s",
        )
    kubectl("delete", "-f", str(EXTENDED_CLASSES), "--ignore-not-found")
    kubectl("label", "node", NODE_NAME, f"{MODE_LABEL}-", check=False)
    ctr("images", "rm", SMOKE_IMAGE, check=False)


def test_the_readme_has_the_blocks_this_file_runs() -> None:
    assert tuple(block.name for block in command_blocks("cluster")) == BLOCKS


def test_the_device_plugin_alone(reader: Path) -> None:
    run_block(reader, "label-gpu-node")
    run_block(reader, "install-plugin")
    plugin_serving()
    check_plugin(reader)
    smoke(reader, "smoke-plugin")
    run_block(reader, "uninstall")
    release_gone()


def test_the_dra_driver_alone(reader: Path) -> None:
    run_block(reader, "install-dra")
    driver_serving()
    assert no_pods(PLUGIN_LABEL)
    check_dra(reader)
    smoke(reader, "smoke-dra")
    run_block(reader, "uninstall")
    release_gone()


def test_both_with_the_node_moved_to_dra_and_back(reader: Path) -> None:
    run_block(reader, "install-both")
    plugin_serving()
    assert no_pods(DRIVER_LABEL)  # no node carries the label yet
    check_plugin(reader)
    smoke(reader, "smoke-plugin")

    run_block(reader, "to-dra")
    assert mode_label() == "true"
    wait_until("the device plugin's pod gone", lambda: no_pods(PLUGIN_LABEL), timeout=120)
    # the Node shows the departed plugin's 0 at the kubelet's next status update; a limits pod
    # bound before that would be given to the plugin that left
    wait_until(f"{GPU} allocatable 0", lambda: extended(GPU) == 0, timeout=60)
    driver_serving()
    check_dra(reader)
    smoke(reader, "smoke-dra")
    if served("DRAExtendedResource"):
        # an unchanged limits pod, served by the driver through the extended-resource class
        smoke(reader, "smoke-plugin")
    else:  # before 1.36 the API server drops the class's extendedResourceName: the pod waits
        assert "extendedResourceName" not in get("deviceclass", "gpu-extended.nvidia.com")["spec"]

    run_block(reader, "back-to-plugin")
    assert mode_label() == "false"
    plugin_serving()
    assert daemon_pod(DRIVER_LABEL)  # stays to release what it prepared
    check_plugin(reader)
    smoke(reader, "smoke-plugin")
    # the README's "once the driver's /status shows prepared_claims: 0", read from its checkpoint
    wait_until("the driver's claims released", lambda: not prepared_in_checkpoint(), timeout=120)

    run_block(reader, "unlabel")
    assert mode_label() is None
    wait_until("the DRA driver's pod gone", lambda: no_pods(DRIVER_LABEL), timeout=120)
    run_block(reader, "uninstall")
    release_gone()
