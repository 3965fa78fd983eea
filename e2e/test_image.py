"""The whole node in one test: the plugin's image run as manifests/ run it, the project's kubelet
emulator on the mounted directory, Allocate, and a workload container started with what the
answer says.

Needs root and podman (`make e2e` prepares both and builds the image first); IMAGE names the
image under test and E2E_BASE_IMAGE its base. The container's settings are read from
manifests/daemonset.yaml, not copied here, so a change there is what this test runs.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from deviceplugin.demos.plugin import write_configmap
from deviceplugin.sim.kubelet import KubeletEmulator
from deviceplugin.wire.deviceplugin.v1beta1 import api_pb2
from e2e.runtime import CDI_KIND, cdi_args, device_nodes, host_node, needs_podman, podman, workload

ROOT = Path(__file__).resolve().parent.parent
IMAGE = os.environ.get("IMAGE", "localhost/deviceplugin:e2e")
BASE_IMAGE = os.environ.get("E2E_BASE_IMAGE", "localhost/deviceplugin-e2e-base:bookworm")
NODE = "a100-80gb-x8-mixed"
MAX_ADDED_MB = 45

pytestmark = needs_podman


# --- the image itself ---------------------------------------------------------------------------


def test_the_image_holds_the_plugin_and_no_installer() -> None:
    version = podman(
        "run", "--rm", "--network", "none", "--entrypoint", "deviceplugin", IMAGE, "--version"
    ).stdout.strip()
    assert version == f"deviceplugin {pyproject_version()}"
    labels = json.loads(podman("image", "inspect", "--format", "{{json .Labels}}", IMAGE).stdout)
    assert labels["org.opencontainers.image.version"] == pyproject_version()
    probe = podman(
        "run",
        "--rm",
        "--network",
        "none",
        "--entrypoint",
        "sh",
        IMAGE,
        "-c",
        "python3 -m pip --version; python3 -c 'import setuptools'; command -v gcc cc pip pip3;"
        " ls -d /root/.cache/pip 2>/dev/null; true",
        check=False,
    )
    assert "No module named pip" in probe.stderr
    assert "No module named 'setuptools'" in probe.stderr
    assert probe.stdout.strip() == "", f"installers or caches left: {probe.stdout}"


def test_the_image_adds_little_to_its_base() -> None:
    def size(image: str) -> int:
        return int(podman("image", "inspect", "--format", "{{.Size}}", image).stdout)

    added_mb = (size(IMAGE) - size(BASE_IMAGE)) / 1e6
    print(f"image adds {added_mb:.1f} MB to {BASE_IMAGE}")
    assert added_mb <= MAX_ADDED_MB


def pyproject_version() -> str:
    import tomllib

    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


# --- the node -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Node:
    """Host directories standing in for a GPU node, mounted where the DaemonSet mounts them."""

    root: Path
    kubelet_dir: Path
    cdi_dir: Path
    configmap: Path
    driver_root: Path

    @property
    def pod_resources_dir(self) -> Path:
        """The kubelet's pod-resources directory: empty here (no kubelet serves it)."""
        return self.root / "pod-resources"


@pytest.fixture
def node() -> Iterator[Node]:
    root = Path(tempfile.mkdtemp(prefix="dp-e2e-node-"))
    driver_root = root / "host"
    subprocess.run(
        [str(ROOT / ".venv" / "bin" / "deviceplugin"), "sim-root", NODE, str(driver_root)],
        check=True,
        capture_output=True,
    )
    configmap = root / "configmap"
    write_configmap(configmap, seed_config())
    node = Node(root, root / "device-plugins", root / "cdi", configmap, driver_root)
    node.kubelet_dir.mkdir()
    node.cdi_dir.mkdir()
    node.pod_resources_dir.mkdir()
    try:
        yield node
    finally:
        shutil.rmtree(root, ignore_errors=True)


def daemonset() -> dict[str, Any]:
    docs = yaml.safe_load_all((ROOT / "manifests" / "daemonset.yaml").read_text())
    (ds,) = [doc for doc in docs if doc and doc["kind"] == "DaemonSet"]
    return dict(ds)


def seed_config() -> str:
    docs = yaml.safe_load_all((ROOT / "manifests" / "configmap.yaml").read_text())
    (cm,) = [doc for doc in docs if doc and doc["kind"] == "ConfigMap"]
    return str(cm["data"]["config.yaml"])


def run_args(node: Node, name: str, extra_env: dict[str, str]) -> list[str]:
    """`podman run` arguments for the plugin container, from the DaemonSet's pod spec."""
    pod = daemonset()["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    context = container["securityContext"]
    args = ["run", "-d", "--name", name, "--network", "none"]
    if context.get("readOnlyRootFilesystem"):
        args.append("--read-only")
    args += [f"--cap-drop={cap}" for cap in context["capabilities"].get("drop", [])]
    args += [f"--cap-add={cap}" for cap in context["capabilities"].get("add", [])]
    if context.get("allowPrivilegeEscalation") is False:
        args += ["--security-opt", "no-new-privileges"]
    args += ["--user", f"{context['runAsUser']}:{context['runAsGroup']}"]
    host_dirs = {
        "/var/lib/kubelet/device-plugins": node.kubelet_dir,
        "/var/run/cdi": node.cdi_dir,
        "/var/lib/kubelet/pod-resources": node.pod_resources_dir,
    }
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        target = mount["mountPath"]
        mode = "ro" if mount.get("readOnly") else "rw"
        if "hostPath" in volume:
            args += ["-v", f"{host_dirs[volume['hostPath']['path']]}:{target}:{mode}"]
        elif "configMap" in volume:
            args += ["-v", f"{node.configmap}:{target}:{mode}"]
        elif "emptyDir" in volume:
            args += ["--tmpfs", target]
    # The simulated host's files, seen in the container where they are on the host: the CDI
    # spec names host paths, and the plugin checks them from inside.
    args += ["-v", f"{node.driver_root}:{node.driver_root}:ro"]
    env = {entry["name"]: str(entry["value"]) for entry in container.get("env", [])}
    env.update(extra_env)
    for key, value in env.items():
        args += ["-e", f"{key}={value}"]
    return [*args, IMAGE]


async def wait_registered(kubelet: KubeletEmulator, counts: dict[str, int], name: str) -> None:
    ok = await kubelet.wait_for(
        lambda: all(len(kubelet.devices(r)) == n for r, n in counts.items()), timeout=30
    )
    if not ok:
        logs = podman("logs", name, check=False)
        seen = {r: len(kubelet.devices(r)) for r in counts}
        pytest.fail(f"registered {seen}, expected {counts}\n{logs.stdout}{logs.stderr}")


def test_the_node_as_a_kubelet_and_runtime_would_run_it(node: Node) -> None:
    asyncio.run(_the_node(node))


async def _the_node(node: Node) -> None:
    name = f"dp-e2e-{os.getpid()}-{time.monotonic_ns()}"
    kubelet = KubeletEmulator(node.kubelet_dir)
    await kubelet.start()
    extra_env = {
        "DP_SIMULATE": NODE,
        "NVIDIA_DRIVER_ROOT": str(node.driver_root),
        "DEVICE_LIST_STRATEGY": "envvar,cdi-cri",
        "PASS_DEVICE_SPECS": "true",
    }
    started = time.monotonic()
    podman(*run_args(node, name, extra_env))
    try:
        # 1. Registered from a read-only, capability-free, network-less container.
        await wait_registered(kubelet, {"nvidia.com/gpu": 8, "nvidia.com/mig-1g.10gb": 28}, name)
        print(f"plugin container registered both resources in {time.monotonic() - started:.2f} s")
        ready = podman(
            "exec",
            name,
            "python3",
            "-c",
            "import urllib.request;print(urllib.request.urlopen('http://127.0.0.1:8080/readyz')"
            ".read().decode())",
            check=False,
        )
        assert ready.stdout.strip() == "ready", ready.stderr

        # 2. A GPU and a MIG device, each started in a workload container twice: once from the
        #    CDI names (resolved from the spec the plugin container wrote into the mounted CDI
        #    directory), once from the env and device specs of the same answer.
        spec_files = sorted(p.name for p in node.cdi_dir.iterdir())
        assert spec_files == ["k8s.device-plugin.nvidia.com-gpu.json"]
        for resource, expected_caps in (("nvidia.com/gpu", 0), ("nvidia.com/mig-1g.10gb", 2)):
            device_id = sorted(kubelet.devices(resource))[0]
            response = (await kubelet.allocate(resource, [[device_id]])).container_responses[0]
            check_workloads(node, response, expected_caps)
        unknown = workload(node.cdi_dir, ["--device", f"{CDI_KIND}=no-such-device"])
        assert unknown.returncode != 0 and "unresolvable CDI devices" in unknown.stderr

        # 3. A ConfigMap edit reaches the running container and is applied live.
        write_configmap(node.configmap, seed_config().replace("replicas: 2", "replicas: 4"))
        await wait_registered(kubelet, {"nvidia.com/gpu": 16, "nvidia.com/mig-1g.10gb": 28}, name)

        # 4. SIGTERM: a clean stop, and no socket of ours left for the kubelet to dial.
        podman("kill", "--signal", "TERM", name)
        code = podman("wait", name, timeout=30).stdout.strip()
        logs = podman("logs", name, check=False)
        assert code == "0", logs.stderr
        left = sorted(p.name for p in node.kubelet_dir.iterdir() if p.name != "kubelet.sock")
        assert left == []
    finally:
        podman("rm", "-f", "-t", "0", name, check=False)
        await kubelet.stop()


def check_workloads(
    node: Node, response: api_pb2.ContainerAllocateResponse, expected_caps: int
) -> None:
    specs = {spec.container_path: host_node(spec.host_path) for spec in response.devices}
    gpus = [path for path in specs if path.startswith("/dev/nvidia") and path[11:].isdigit()]
    caps = [path for path in specs if path.startswith("/dev/nvidia-caps/")]
    assert len(gpus) == 1 and len(caps) == expected_caps, sorted(specs)

    names = [device.name for device in response.cdi_devices]
    assert names and all(n.startswith(CDI_KIND + "=") for n in names)
    via_cdi = workload(node.cdi_dir, cdi_args(names))
    assert via_cdi.returncode == 0, via_cdi.stderr
    assert device_nodes(via_cdi.stdout) == specs

    env = dict(response.envs)
    device_args = [
        arg
        for spec in response.devices
        for arg in ("--device", f"{spec.host_path}:{spec.container_path}:{spec.permissions}m")
    ]
    env_args = [arg for key, value in env.items() for arg in ("-e", f"{key}={value}")]
    via_specs = workload(node.cdi_dir, [*device_args, *env_args])
    assert via_specs.returncode == 0, via_specs.stderr
    assert device_nodes(via_specs.stdout) == specs
