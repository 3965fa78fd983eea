"""The Helm chart agrees with the program it deploys and with the reference chart's value names.

Pure checks of Chart.yaml and values.yaml always run; renderings need Helm (`make lint` builds it
at e2e/cluster/run/bin/helm; a `helm` on PATH does too) and are skipped without it. Schema
validation of the renderings is `make lint`'s job (e2e/helm/check-chart.sh); these tests check
what a schema cannot: the environment is what `serve` reads, a config change rolls no pod, the
RBAC is what the features need and nothing more, bad values fail naming the problem."""

from __future__ import annotations

import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from deviceplugin.cli import SERVE_ENV_VARS
from deviceplugin.model.config import parse_config

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "manifests" / "helm" / "deviceplugin"
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
SIMULATED = ROOT / "e2e" / "cluster" / "values-simulated-node.yaml"
# Set on the pod for the NVIDIA container runtime, or from the downward API for the node agent.
OTHER_ENV = {"NVIDIA_MIG_MONITOR_DEVICES", "POD_NAMESPACE"}
Doc = dict[str, Any]


def helm_binary() -> str | None:
    built = ROOT / "e2e" / "cluster" / "run" / "bin" / "helm"
    return str(built) if built.exists() else shutil.which("helm")


HELM = helm_binary()
needs_helm = pytest.mark.skipif(HELM is None, reason="no helm (make lint builds it)")


def render(*args: str) -> list[Doc]:
    assert HELM is not None
    done = subprocess.run(
        [HELM, "template", "rel", str(CHART), "--namespace", "gpu", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def render_error(*args: str) -> str:
    assert HELM is not None
    done = subprocess.run(
        [HELM, "template", "rel", str(CHART), *args], capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    return done.stderr


def of_kind(docs: list[Doc], kind: str) -> list[Doc]:
    return [doc for doc in docs if doc["kind"] == kind]


def plugin(docs: list[Doc]) -> Doc:
    (ds,) = [d for d in of_kind(docs, "DaemonSet") if not d["metadata"]["name"].endswith("-dra")]
    return ds


def container_env(ds: Doc) -> dict[str, Any]:
    container = ds["spec"]["template"]["spec"]["containers"][0]
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in container["env"]}


NAMED = ("--values", str(CHART / "ci" / "named-configs-values.yaml"))


# --- without Helm ---------------------------------------------------------------------------


def test_the_chart_is_this_version() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == version


def test_values_use_the_reference_charts_names() -> None:
    assert set(VALUES["config"]) == {"map", "default", "name"}
    overrides = ("migStrategy", "failOnInitError", "deviceListStrategy", "deviceIDStrategy")
    for key in (*overrides, "gdsEnabled", "mofedEnabled"):
        assert key in VALUES and VALUES[key] is None  # unset: the config files decide
    for key in ("nvidiaDriverRoot", "runtimeClassName"):
        assert key in VALUES
    for key in ("nodeSelector", "affinity", "tolerations", "priorityClassName", "resources"):
        assert key in VALUES
    assert set(VALUES["image"]) == {"repository", "tag", "pullPolicy"}
    assert VALUES["metrics"]["serviceMonitor"]["enabled"] is False


def test_no_template_puts_a_config_checksum_on_the_pods() -> None:
    # serve reloads in process: a checksum annotation would restart every pod at each edit
    for template in (CHART / "templates").iterdir():
        text = template.read_text()
        assert "checksum/" not in text and "sha256sum" not in text, template.name


# --- rendered -------------------------------------------------------------------------------


@needs_helm
@pytest.mark.parametrize(
    "args",
    [(), NAMED, ("--values", str(SIMULATED)), ("--set", "dra.enabled=true", *NAMED)],
    ids=["defaults", "named", "simulated", "dra"],
)
def test_the_environment_is_what_the_programs_read(args: tuple[str, ...]) -> None:
    for ds in of_kind(render(*args), "DaemonSet"):
        assert set(container_env(ds)) - SERVE_ENV_VARS - OTHER_ENV == set()
        annotations = ds["spec"]["template"]["metadata"].get("annotations") or {}
        assert not [key for key in annotations if "checksum" in key]


@needs_helm
def test_feature_switches_are_rendered_only_when_set() -> None:
    env = container_env(plugin(render()))
    assert not {"GDS_ENABLED", "MOFED_ENABLED", "GDRCOPY_ENABLED"} & set(env)
    env = container_env(plugin(render("--set", "gdsEnabled=false", "--set", "mofedEnabled=true")))
    assert (env["GDS_ENABLED"], env["MOFED_ENABLED"]) == ("false", "true")
    assert "GDRCOPY_ENABLED" not in env


@needs_helm
def test_named_configs_are_mounted_whole_and_each_one_parses() -> None:
    docs = render(*NAMED)
    (configmap,) = of_kind(docs, "ConfigMap")
    for name, text in configmap["data"].items():
        parse_config(text, source=name)
    ds = plugin(docs)
    env = container_env(ds)
    assert env["DEFAULT_CONFIG"] in configmap["data"]
    spec = ds["spec"]["template"]["spec"]
    mounts = {m["name"]: m for m in spec["containers"][0]["volumeMounts"]}
    assert mounts["configs"]["mountPath"] == env["DP_CONFIG_DIR"]
    assert "subPath" not in mounts["configs"]  # a subPath mount never sees an update
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["configs"]["configMap"]["name"] == configmap["metadata"]["name"]
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert volumes["driver-root"]["hostPath"]["path"] == "/run/nvidia/driver"
    assert mounts["driver-root"]["mountPath"] == "/run/nvidia/driver"
    # migStrategy mixed: MIG monitoring, and the one capability the runtime demands for it
    security = spec["containers"][0]["securityContext"]
    assert env["NVIDIA_MIG_MONITOR_DEVICES"] == "all"
    assert security["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}


@needs_helm
def test_defaults_are_least_privilege() -> None:
    docs = render()
    spec = plugin(docs)["spec"]["template"]["spec"]
    security = spec["containers"][0]["securityContext"]
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["readOnlyRootFilesystem"] and not security["allowPrivilegeEscalation"]
    assert container_env(plugin(docs))["NVIDIA_MIG_MONITOR_DEVICES"] == ""
    # GPU labels are on by default: read and patch its Node, keep its NodeFeature; no more
    (role,) = of_kind(docs, "ClusterRole")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]}
    ]
    (features,) = of_kind(docs, "Role")
    assert features["rules"][0]["resources"] == ["nodefeatures"]
    assert spec["automountServiceAccountToken"] is True


@needs_helm
@pytest.mark.parametrize(
    ("args", "monitored"),
    [
        (("--set-string", "config.map.a=version: v1\nflags:\n  migStrategy: mixed"), True),
        (("--set-string", "config.map.a=version: v1\nflags:\n  migStrategy: none"), False),
        (("--set-string", "config.map.a=version: v1", "--set", "migStrategy=single"), True),
        (("--set", "migStrategy=none", "--set", "config.name=theirs"), False),
        (("--set", "config.name=theirs"), True),
    ],
    ids=["config-mixed", "config-none", "flag-single", "flag-none-wins", "external-configs"],
)
def test_mig_monitoring_where_a_config_may_ask_for_mig_devices(
    args: tuple[str, ...], monitored: bool
) -> None:
    ds = plugin(render(*args))
    capabilities = ds["spec"]["template"]["spec"]["containers"][0]["securityContext"][
        "capabilities"
    ]
    assert (container_env(ds)["NVIDIA_MIG_MONITOR_DEVICES"] == "all") is monitored
    assert (capabilities.get("add") == ["SYS_ADMIN"]) is monitored


@needs_helm
def test_without_configs_or_labels_the_plugin_holds_no_token_and_no_role() -> None:
    docs = render("--set", "gpuLabels.enabled=false")
    spec = plugin(docs)["spec"]["template"]["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in spec
    assert not [d for d in docs if d["kind"] in ("ClusterRole", "Role", "ServiceAccount")]


@needs_helm
def test_named_configs_without_labels_read_the_node_and_post_events_only() -> None:
    docs = render(*NAMED, "--set", "gpuLabels.enabled=false")
    (role,) = of_kind(docs, "ClusterRole")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}
    ]
    (events,) = of_kind(docs, "Role")
    assert events["metadata"]["namespace"] == "default"
    assert events["rules"] == [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]


@needs_helm
def test_the_dra_driver_follows_the_same_configs() -> None:
    docs = render("--set", "dra.enabled=true", *NAMED)
    (dra,) = [d for d in of_kind(docs, "DaemonSet") if d["metadata"]["name"].endswith("-dra")]
    container = dra["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["deviceplugin", "dra", "serve"]
    assert container["image"] == "deviceplugin:0.1.0-dra"
    env = container_env(dra)
    assert env["DP_CONFIG_DIR"] == container_env(plugin(docs))["DP_CONFIG_DIR"]
    assert {d["metadata"]["name"] for d in of_kind(docs, "DeviceClass")} == {
        "gpu.nvidia.com",
        "mig.nvidia.com",
        "mig-1g.10gb.nvidia.com",
    }
    (binding,) = [
        d for d in of_kind(docs, "RoleBinding") if d["metadata"]["namespace"] == "default"
    ]
    assert {s["name"] for s in binding["subjects"]} == {"rel-deviceplugin", "rel-deviceplugin-dra"}


@needs_helm
def test_the_simulated_node_values_run_the_plugin_as_the_overlay_does() -> None:
    overlay = yaml.safe_load(
        (ROOT / "manifests" / "overlays" / "simulated-node" / "simulated-node.yaml").read_text()
    )
    wanted = {
        e["name"]: e["value"] for e in overlay["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    env = container_env(plugin(render("--values", str(SIMULATED))))
    assert {name: env.get(name) for name in wanted} == wanted


@needs_helm
@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (
            ("--set-string", "config.map.a=version: v1", "--set", "config.default=b"),
            'config.default "b" is not a key of config.map (a)',
        ),
        (
            ("--set-string", "config.map.a=x", "--set", "config.name=existing"),
            "config.name and config.map are both set",
        ),
        (
            ("--set-string", "config.map.a=x", "--set-string", "config.map.b=y"),
            "config.map holds several configs and config.default is empty",
        ),
    ],
)
def test_bad_values_fail_naming_the_problem(args: tuple[str, ...], fragment: str) -> None:
    assert fragment in render_error(*args)


@needs_helm
def test_a_service_monitor_when_asked() -> None:
    docs = render("--set", "metrics.serviceMonitor.enabled=true")
    (monitor,) = of_kind(docs, "ServiceMonitor")
    (service,) = of_kind(docs, "Service")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert service["spec"]["selector"] == plugin(docs)["spec"]["selector"]["matchLabels"]
