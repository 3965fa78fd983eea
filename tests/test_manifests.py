"""The deploy files agree with the program they deploy: the DaemonSets set only environment
variables `serve` reads, point CONFIG_FILE into the mounted ConfigMap, probe the HTTP endpoints
on the port `serve` listens on, and keep the least-privilege settings; the Dockerfile starts
`deviceplugin serve` with the NVIDIA runtime variables. Schema validation is `make lint`'s job
(kubernetes-validate); these tests check what a schema cannot."""

from __future__ import annotations

import copy
import json
import posixpath
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
MANIFESTS = ROOT / "manifests"
BASE_FILES = sorted(MANIFESTS.glob("*.yaml"))
VARIANT_FILES = sorted((MANIFESTS / "variants").glob("*.yaml"))
DOCKERFILE = ROOT / "Dockerfile"

# Read by the NVIDIA container runtime when it creates the container, not by `serve`.
RUNTIME_ENV_VARS = frozenset(
    {"NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "NVIDIA_MIG_MONITOR_DEVICES"}
)
KUBELET_DIR = "/var/lib/kubelet/device-plugins"
CDI_DIR = "/var/run/cdi"
POD_RESOURCES_DIR = "/var/lib/kubelet/pod-resources"

Doc = dict[str, Any]


def load(path: Path) -> list[Doc]:
    with path.open(encoding="utf-8") as file:
        return [doc for doc in yaml.safe_load_all(file) if doc]


def docs_of(paths: list[Path]) -> list[Doc]:
    return [doc for path in paths for doc in load(path)]


def only(docs: list[Doc], kind: str) -> Doc:
    found = [doc for doc in docs if doc["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


BASE = docs_of(BASE_FILES)
BASE_DS = only(BASE, "DaemonSet")
CONFIGMAP = only(BASE, "ConfigMap")
VARIANTS = {path.stem: only(load(path), "DaemonSet") for path in VARIANT_FILES}
ALL_DS = {"base": BASE_DS, **VARIANTS}
ALL_DS_PARAMS = [pytest.param(ds, id=name) for name, ds in ALL_DS.items()]


def pod(ds: Doc) -> Doc:
    spec: Doc = ds["spec"]["template"]["spec"]
    return spec


def container(ds: Doc) -> Doc:
    containers = pod(ds)["containers"]
    assert len(containers) == 1
    main: Doc = containers[0]
    return main


def env(ds: Doc) -> dict[str, str]:
    entries = container(ds).get("env", [])
    for entry in entries:
        assert "valueFrom" not in entry, f"{entry['name']}: only literal values are expected"
    names = [entry["name"] for entry in entries]
    assert len(names) == len(set(names)), f"duplicate env vars: {names}"
    return {entry["name"]: str(entry["value"]) for entry in entries}


def volumes(ds: Doc) -> dict[str, Doc]:
    return {volume["name"]: volume for volume in pod(ds).get("volumes", [])}


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with continuation lines joined and comments dropped."""
    text = DOCKERFILE.read_text(encoding="utf-8")
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in logical]


def dockerfile_final_env() -> dict[str, str]:
    """ENV of the last stage (KEY=VALUE form)."""
    instructions = dockerfile_instructions()
    last_from = max(i for i, (op, _) in enumerate(instructions) if op == "FROM")
    values: dict[str, str] = {}
    for op, args in instructions[last_from:]:
        if op == "ENV":
            for pair in re.findall(r"(\w+)=(\"[^\"]*\"|\S+)", args):
                values[pair[0]] = pair[1].strip('"')
    return values


# --- what `kubectl apply -f manifests/` takes ---------------------------------------------------


def test_manifest_directory_holds_only_kubernetes_objects() -> None:
    # kubectl apply -f manifests/ reads every .yaml there: a kustomization.yaml or another
    # non-object would make it fail; variants sit one level down where -f does not recurse.
    assert {path.name for path in BASE_FILES} == {"configmap.yaml", "daemonset.yaml"}
    assert not list(MANIFESTS.glob("*.yml")) and not list(MANIFESTS.glob("*.json"))
    for doc in BASE:
        assert {"apiVersion", "kind", "metadata"} <= doc.keys()
        assert doc["metadata"]["namespace"] == "kube-system"
        assert doc["metadata"]["labels"]["app.kubernetes.io/name"] == "deviceplugin"


# --- environment ----------------------------------------------------------------------------


@pytest.mark.parametrize("ds", ALL_DS_PARAMS)
def test_env_vars_are_ones_serve_reads(ds: Doc) -> None:
    from deviceplugin.cli import SERVE_ENV_VARS

    unknown = set(env(ds)) - SERVE_ENV_VARS - RUNTIME_ENV_VARS
    assert not unknown, f"env vars that `deviceplugin serve` does not read: {sorted(unknown)}"


def test_base_env_values() -> None:
    values = env(BASE_DS)
    assert values["DP_LOG_FORMAT"] == "json"
    assert "DP_HTTP_ADDRESS" in values
    assert "PASS_DEVICE_SPECS" not in values
    assert values["NVIDIA_MIG_MONITOR_DEVICES"] == "", "the image's MIG monitoring is switched off"


# --- config ---------------------------------------------------------------------------------


@pytest.mark.parametrize("ds", ALL_DS_PARAMS)
def test_config_file_lives_in_the_configmap_directory_mount(ds: Doc) -> None:
    config_file = env(ds)["CONFIG_FILE"]
    directory, name = posixpath.split(config_file)
    config_volumes = [
        v
        for v in volumes(ds).values()
        if v.get("configMap", {}).get("name") == "deviceplugin-config"
    ]
    assert len(config_volumes) == 1
    mounts = [m for m in container(ds)["volumeMounts"] if m["name"] == config_volumes[0]["name"]]
    assert len(mounts) == 1
    # A subPath mount is never updated by the kubelet, which would defeat live reload.
    assert "subPath" not in mounts[0] and "subPathExpr" not in mounts[0]
    assert "items" not in config_volumes[0]["configMap"]
    assert mounts[0]["mountPath"].rstrip("/") == directory
    assert mounts[0].get("readOnly") is True
    assert CONFIGMAP["metadata"]["name"] == "deviceplugin-config"
    assert name in CONFIGMAP["data"]


def test_configmap_config_parses() -> None:
    from deviceplugin.model.config import parse_config

    parsed = parse_config(CONFIGMAP["data"]["config.yaml"], source="manifests/configmap.yaml")
    config = parsed.config
    assert config.flags.mig_strategy == "mixed"
    time_slicing = config.sharing.time_slicing
    assert time_slicing is not None
    assert [(r.name, r.replicas) for r in time_slicing.resources] == [("nvidia.com/gpu", 2)]


# --- host access and privileges --------------------------------------------------------------


def host_mounts(ds: Doc) -> dict[str, tuple[Doc, Doc]]:
    """mountPath -> (hostPath volume source, volumeMount) for every host directory mounted."""
    mounts = {m["name"]: m for m in container(ds)["volumeMounts"]}
    return {
        mounts[name]["mountPath"]: (volume["hostPath"], mounts[name])
        for name, volume in volumes(ds).items()
        if "hostPath" in volume
    }


def test_base_host_paths_are_only_the_kubelet_and_cdi_directories() -> None:
    found = {path: source for path, (source, _) in host_mounts(BASE_DS).items()}
    assert found == {
        KUBELET_DIR: {"path": KUBELET_DIR, "type": "Directory"},
        CDI_DIR: {"path": CDI_DIR, "type": "DirectoryOrCreate"},
        POD_RESOURCES_DIR: {"path": POD_RESOURCES_DIR, "type": "Directory"},
    }


@pytest.mark.parametrize("ds", ALL_DS_PARAMS)
def test_the_pod_resources_api_is_mounted_read_only(ds: Doc) -> None:
    # /status and `inspect --pods` name the pod that holds each device: the plugin lists the
    # kubelet's pod-resources socket, and needs nothing else from that directory.
    source, mount = host_mounts(ds)[POD_RESOURCES_DIR]
    assert source["path"] == POD_RESOURCES_DIR
    assert mount.get("readOnly") is True


@pytest.mark.parametrize("ds", ALL_DS_PARAMS)
def test_the_cdi_spec_directory_is_the_hosts_and_writable(ds: Doc) -> None:
    # The runtime reads the spec on the host, from /var/run/cdi: the plugin's spec directory
    # (DP_CDI_SPEC_DIR, default /var/run/cdi) must be that host directory, writable, whether or
    # not the ConfigMap asks for a CDI strategy today (an edit can switch to one live).
    spec_dir = env(ds).get("DP_CDI_SPEC_DIR", CDI_DIR)
    source, mount = host_mounts(ds)[spec_dir]
    assert source == {"path": CDI_DIR, "type": "DirectoryOrCreate"}
    assert not mount.get("readOnly", False) and "subPath" not in mount


@pytest.mark.parametrize("ds", ALL_DS_PARAMS)
def test_least_privilege(ds: Doc) -> None:
    spec = pod(ds)
    assert spec["automountServiceAccountToken"] is False
    assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC")
    context = container(ds)["securityContext"]
    assert context["allowPrivilegeEscalation"] is False
    assert context.get("privileged", False) is False
    assert context["readOnlyRootFilesystem"] is True
    assert context["capabilities"]["drop"] == ["ALL"]
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    # A read-only root file system needs a writable /tmp.
    tmp = [m for m in container(ds)["volumeMounts"] if m["mountPath"] == "/tmp"]
    assert len(tmp) == 1 and "emptyDir" in volumes(ds)[tmp[0]["name"]]


@pytest.mark.parametrize("ds", ALL_DS_PARAMS)
def test_mig_monitoring_comes_with_sys_admin_and_only_then(ds: Doc) -> None:
    # The NVIDIA container runtime refuses to create a container that sets
    # NVIDIA_MIG_MONITOR_DEVICES without CAP_SYS_ADMIN, and SYS_ADMIN is granted for nothing else.
    effective = {**dockerfile_final_env(), **env(ds)}
    wants_mig_monitor = effective.get("NVIDIA_MIG_MONITOR_DEVICES", "") != ""
    added = container(ds)["securityContext"]["capabilities"].get("add", [])
    assert added == (["SYS_ADMIN"] if wants_mig_monitor else [])


@pytest.mark.parametrize("ds", ALL_DS_PARAMS)
def test_host_roots_are_mounted_where_they_are_on_the_host(ds: Doc) -> None:
    # NVIDIA_DRIVER_ROOT / NVIDIA_DEV_ROOT are host paths: device specs name files below them
    # and the plugin checks those files exist, so a root other than / must be visible in the
    # container at the same path.
    host_mounts = {
        m["mountPath"]: volumes(ds)[m["name"]].get("hostPath", {}).get("path")
        for m in container(ds)["volumeMounts"]
    }
    for name in ("NVIDIA_DRIVER_ROOT", "NVIDIA_DEV_ROOT"):
        root = env(ds).get(name, "/")
        if root != "/":
            assert host_mounts.get(root) == root, f"{name}={root} is not mounted from the host"


# --- HTTP endpoints ---------------------------------------------------------------------------


@pytest.mark.parametrize("ds", ALL_DS_PARAMS)
def test_probes_hit_healthz_and_readyz_on_the_http_address_port(ds: Doc) -> None:
    main = container(ds)
    host, _, port = env(ds)["DP_HTTP_ADDRESS"].rpartition(":")
    assert host in ("0.0.0.0", "[::]", ""), "kubelet probes come over the pod IP"
    ports = {p["name"]: p["containerPort"] for p in main["ports"]}

    def probe_port(probe: Doc) -> int:
        target = probe["httpGet"]["port"]
        return ports[target] if isinstance(target, str) else int(target)

    assert main["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert main["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert probe_port(main["livenessProbe"]) == int(port)
    assert probe_port(main["readinessProbe"]) == int(port)
    annotations = ds["spec"]["template"]["metadata"].get("annotations", {})
    if "prometheus.io/port" in annotations:
        assert annotations["prometheus.io/port"] == port


# --- scheduling and rollout -------------------------------------------------------------------


@pytest.mark.parametrize("ds", ALL_DS_PARAMS)
def test_scheduling_and_rollout(ds: Doc) -> None:
    spec = pod(ds)
    labels = {"app.kubernetes.io/name": "deviceplugin"}
    assert ds["spec"]["selector"]["matchLabels"] == labels
    assert labels.items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert spec["priorityClassName"] == "system-node-critical"
    tolerations = {(t["key"], t["operator"], t.get("effect")) for t in spec["tolerations"]}
    assert ("nvidia.com/gpu", "Exists", "NoSchedule") in tolerations
    assert ("CriticalAddonsOnly", "Exists", None) in tolerations
    assert ds["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},  # beside the old pod
    }
    assert spec["terminationGracePeriodSeconds"] <= 30
    resources = container(ds)["resources"]
    assert {"cpu", "memory"} <= resources["requests"].keys()
    assert "memory" in resources["limits"]


def test_image_tag_is_the_project_version() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "version"
    ]
    assert container(BASE_DS)["image"].rsplit(":", 1)[1] == version


# --- variants ---------------------------------------------------------------------------------


def _without_env(ds: Doc, names: set[str]) -> Doc:
    stripped = copy.deepcopy(ds)
    main = container(stripped)
    main["env"] = [entry for entry in main["env"] if entry["name"] not in names]
    return stripped


def test_device_specs_variant_is_the_base_plus_pass_device_specs() -> None:
    variant = VARIANTS["daemonset-device-specs"]
    assert env(variant)["PASS_DEVICE_SPECS"] == "true"
    # Same name, so it replaces the base: two plugins on a node would fight over the sockets.
    assert variant["metadata"] == BASE_DS["metadata"]
    assert _without_env(variant, {"PASS_DEVICE_SPECS"}) == BASE_DS


def test_mig_variant_is_the_base_plus_mig_monitoring() -> None:
    variant = VARIANTS["daemonset-mig"]
    assert env(variant)["NVIDIA_MIG_MONITOR_DEVICES"] == "all"
    assert variant["metadata"] == BASE_DS["metadata"]
    expected = copy.deepcopy(BASE_DS)
    container(expected)["securityContext"]["capabilities"]["add"] = ["SYS_ADMIN"]
    monitor = {"NVIDIA_MIG_MONITOR_DEVICES"}
    assert _without_env(variant, monitor) == _without_env(expected, monitor)


def test_every_variant_is_checked() -> None:
    assert set(VARIANTS) == {"daemonset-device-specs", "daemonset-mig"}


# --- Dockerfile -------------------------------------------------------------------------------


def test_dockerfile_entrypoint_and_base_image_argument() -> None:
    instructions = dockerfile_instructions()
    assert instructions[0][0] == "ARG" and instructions[0][1].startswith("BASE_IMAGE=")
    froms = [args for op, args in instructions if op == "FROM"]
    assert len(froms) >= 2, "multi-stage build"
    assert all(args.split()[0] == "${BASE_IMAGE}" for args in froms)
    entrypoints = [args for op, args in instructions if op == "ENTRYPOINT"]
    assert len(entrypoints) == 1
    assert json.loads(entrypoints[0]) == ["deviceplugin", "serve"]


def test_dockerfile_runtime_env() -> None:
    values = dockerfile_final_env()
    assert values["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert values["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    assert values["NVIDIA_MIG_MONITOR_DEVICES"] == "all"
    assert values["PYTHONUNBUFFERED"] == "1"


def test_dockerfile_installs_only_the_wheels_it_was_given() -> None:
    # Offline builds: every install in the image reads the wheels `make image` made on the
    # host, never an index, and leaves no pip cache behind.
    runs = [args for op, args in dockerfile_instructions() if op == "RUN"]
    installs = [run for run in runs if re.search(r"pip( --python \S+)? install", run)]
    assert installs
    for run in installs:
        assert "--no-index" in run and "--find-links /wheels" in run and "--no-cache-dir" in run
    copies = [args for op, args in dockerfile_instructions() if op == "COPY"]
    assert "build/wheels /wheels" in copies


def test_the_build_context_is_the_wheels_and_the_stripping_step() -> None:
    lines = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*"
    admitted = {line[1:].rstrip("/") for line in lines[1:] if line.startswith("!")}
    copied = {
        args.split()[0].rstrip("/")
        for op, args in dockerfile_instructions()
        if op == "COPY" and "--from" not in args
    }
    assert copied <= admitted, f"COPY of files the context leaves out: {copied - admitted}"


def test_the_final_image_removes_the_base_installers_and_labels_its_version() -> None:
    instructions = dockerfile_instructions()
    last_from = max(i for i, (op, _) in enumerate(instructions) if op == "FROM")
    final = instructions[last_from:]
    assert any(op == "RUN" and "strip_installers.py" in args for op, args in final)
    labels = " ".join(args for op, args in final if op == "LABEL")
    assert 'org.opencontainers.image.version="${VERSION}"' in labels
    assert any(op == "ARG" and args.startswith("VERSION") for op, args in final)
