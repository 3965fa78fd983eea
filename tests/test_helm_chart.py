"""The Helm chart agrees with the program it deploys and with the reference chart's value names.

Pure checks of Chart.yaml and values.yaml always run; renderings need Helm (`make lint` builds it
at e2e/cluster/run/bin/helm; a `helm` on PATH does too) and are skipped without it. Schema
validation of the renderings is `make lint`'s job (e2e/helm/check-chart.sh); these tests check
what a schema cannot: the environment is what `serve` reads, a config change rolls no pod, the
RBAC is what the features need and nothing more, the admission policies keep each daemon's
writes to its own node, bad values fail naming the problem."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from dranode import inventory
from nodeplacement import runs_on

from deviceplugin.cli import SERVE_ENV_VARS
from deviceplugin.model.config import load_config_text, parse_config
from deviceplugin.model.gpulabels import gpu_labels, owned
from deviceplugin.sim.node import preset_names

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


def driver(docs: list[Doc]) -> Doc:
    (ds,) = [d for d in of_kind(docs, "DaemonSet") if d["metadata"]["name"].endswith("-dra")]
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
    # GPU labels are on by default: list and watch its Node (by field selector), patch it, keep
    # its NodeFeature (get, create, update: deviceplugin/runtime/nodelabels.py); no more
    (role,) = of_kind(docs, "ClusterRole")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch", "patch"]}
    ]
    (features,) = of_kind(docs, "Role")
    assert features["rules"] == [
        {
            "apiGroups": ["nfd.k8s-sigs.io"],
            "resources": ["nodefeatures"],
            "verbs": ["get", "create", "update"],
        }
    ]
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
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]}
    ]
    assert not of_kind(docs, "ValidatingAdmissionPolicy"), "it writes no Node, no NodeFeature"
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


# --- admission policies: each daemon's writes kept to its own node ----------------------------


def policies(docs: list[Doc]) -> dict[str, Doc]:
    """The ValidatingAdmissionPolicies by name, each checked bound (Deny) and failing closed."""
    found = {d["metadata"]["name"]: d for d in of_kind(docs, "ValidatingAdmissionPolicy")}
    bindings = {
        d["spec"]["policyName"]: d["spec"]
        for d in of_kind(docs, "ValidatingAdmissionPolicyBinding")
    }
    assert set(bindings) == set(found)
    for name, policy in found.items():
        assert bindings[name] == {"policyName": name, "validationActions": ["Deny"]}
        assert policy["spec"]["failurePolicy"] == "Fail"
        assert {v.get("reason") for v in policy["spec"]["validations"]} == {"Forbidden"}
        variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
        assert "'authentication.kubernetes.io/node-name'" in variables["node"]
        assert policy["spec"]["validations"][0]["expression"] == "variables.node != ''"
    return found


def matched_user(policy: Doc) -> str:
    (condition,) = policy["spec"]["matchConditions"]
    found = re.fullmatch(r"request\.userInfo\.username == '([^']+)'", condition["expression"])
    assert found, condition
    return found[1]


def owned_keys_pattern(policy: Doc) -> str:
    """The one regular expression the policy's label checks use."""
    patterns = {
        pattern
        for rule in policy["spec"]["validations"]
        for pattern in re.findall(r"\.matches\('([^']+)'\)", rule["expression"])
    }
    (pattern,) = patterns
    return pattern


@needs_helm
def test_the_plugin_may_write_only_its_own_nodes_gpu_labels() -> None:
    docs = render()
    found = policies(docs)
    assert set(found) == {"rel-deviceplugin-nodes", "rel-deviceplugin-nodefeatures"}
    account = plugin(docs)["spec"]["template"]["spec"]["serviceAccountName"]
    for policy in found.values():
        assert matched_user(policy) == f"system:serviceaccount:gpu:{account}"
    nodes = found["rel-deviceplugin-nodes"]["spec"]
    (rule,) = nodes["matchConstraints"]["resourceRules"]
    assert rule["apiGroups"] == [""] and rule["resources"] == ["nodes", "nodes/status"]
    assert rule["operations"] == ["CREATE", "UPDATE", "DELETE"]
    rules = [v["expression"] for v in nodes["validations"]]
    # only an update of the Node itself, the pod's own, and nothing but owned labels changed
    assert (
        "request.operation == 'UPDATE' && (!has(request.subResource) || request.subResource == '')"
        in rules
    )
    assert "request.name == variables.node" in rules
    assert "request.operation != 'UPDATE' || object.spec == oldObject.spec" in rules
    assert any("metadata.?annotations" in r for r in rules)
    features = found["rel-deviceplugin-nodefeatures"]["spec"]
    (rule,) = features["matchConstraints"]["resourceRules"]
    assert rule["apiGroups"] == ["nfd.k8s-sigs.io"] and rule["resources"] == ["nodefeatures"]
    (named,) = [
        v["expression"] for v in features["validations"] if "-deviceplugin" in v["expression"]
    ]
    assert "f.metadata.name == variables.node + '-deviceplugin'" in named
    assert "'nfd.node.kubernetes.io/node-name'" in named


def label_keys() -> set[str]:
    """Every label key the plugin writes on the simulated presets, whatever the MIG strategy."""
    keys: set[str] = set()
    for preset in preset_names():
        found = inventory(preset)
        for strategy in ("none", "single", "mixed"):
            text = f"version: v1\nflags:\n  migStrategy: {strategy}\n"
            keys |= set(gpu_labels(found, load_config_text(text, None, {}, {}).config))
    return keys


@needs_helm
def test_the_policies_allow_exactly_the_label_keys_the_plugin_owns() -> None:
    found = policies(render())
    pattern = owned_keys_pattern(found["rel-deviceplugin-nodes"])
    assert owned_keys_pattern(found["rel-deviceplugin-nodefeatures"]) == pattern
    written = label_keys()
    assert "nvidia.com/mig-1g.10gb.count" in written
    others = {
        "nvidia.com/device-plugin.config",  # the operator's: names the config
        "nvidia.com/gpu.present.x",
        "nvidia.com/gpu",
        "nvidia.com/mig-1g.10gb/count",
        "xnvidia.com/gpu.count",
        "nvidiaxcom/gpu.count",
        "example.com/gpu.count",
        "node-role.kubernetes.io/worker",
        "kubernetes.io/hostname",
    }
    assert {key for key in written if not owned(key)} == set()  # every key it writes it owns
    for key in written | others | {"nvidia.com/mig-7g.80gb.count", "nvidia.com/gpu.replicas"}:
        assert (re.search(pattern, key) is not None) == (owned(key) or key in written), key
    assert not any(owned(key) for key in others)


@needs_helm
def test_the_dra_drivers_slice_policy_is_the_kustomize_one_for_its_release() -> None:
    docs = render("--set", "dra.enabled=true", "--set", "devicePlugin.enabled=false")
    found = policies(docs)
    assert set(found) == {"rel-deviceplugin-dra-resourceslices"}
    (policy,) = found.values()
    assert matched_user(policy) == "system:serviceaccount:gpu:rel-deviceplugin-dra"
    shipped = next(
        d
        for d in yaml.safe_load_all(
            (ROOT / "manifests" / "dra" / "node-restriction.yaml").read_text()
        )
        if d["kind"] == "ValidatingAdmissionPolicy"
    )
    spec = yaml.safe_dump(shipped["spec"]).replace(
        "system:serviceaccount:kube-system:deviceplugin-dra",
        "system:serviceaccount:gpu:rel-deviceplugin-dra",
    )
    assert yaml.safe_load(spec) == policy["spec"]
    # the driver's RBAC: the kustomize ClusterRole's rules, and nothing more
    (role,) = of_kind(docs, "ClusterRole")
    rbac = yaml.safe_load_all((ROOT / "manifests" / "dra" / "rbac.yaml").read_text())
    (shipped_role,) = [d for d in rbac if d["kind"] == "ClusterRole"]
    assert role["rules"] == shipped_role["rules"]


@needs_helm
def test_the_slice_policy_allows_the_configured_driver_name() -> None:
    docs = render("--set", "dra.enabled=true", "--set", "dra.driverName=gpu.example.com")
    found = policies(docs)
    assert set(found) == {
        "rel-deviceplugin-nodes",
        "rel-deviceplugin-nodefeatures",
        "rel-deviceplugin-dra-resourceslices",
    }
    rules = [
        v["expression"] for v in found["rel-deviceplugin-dra-resourceslices"]["spec"]["validations"]
    ]
    assert "variables.slices.all(s, s.spec.driver == 'gpu.example.com')" in rules


def test_the_chart_serves_only_clusters_with_validating_admission_policy_v1() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == ">=1.30.0-0"


@needs_helm
def test_gpu_sharing_reaches_the_driver_and_brings_the_shared_classes() -> None:
    off = render("--set", "dra.enabled=true")
    names = {c["metadata"]["name"] for c in of_kind(off, "DeviceClass")}
    assert "gpu-shared.nvidia.com" not in names
    docs = render("--set", "dra.enabled=true", "--set", "dra.gpuSharing=memory")
    (driver,) = [d for d in of_kind(docs, "DaemonSet") if d["metadata"]["name"].endswith("dra")]
    assert container_env(driver)["DP_DRA_GPU_SHARING"] == "memory"
    classes = {c["metadata"]["name"]: c["spec"] for c in of_kind(docs, "DeviceClass")}
    extended = classes["gpu-shared-extended.nvidia.com"]["extendedResourceName"]
    assert "gpu-shared.nvidia.com" in classes and extended == "nvidia.com/gpu.shared"


@needs_helm
def test_the_mig_mode_reaches_the_driver() -> None:
    for given, expected in ((), "static"), (("--set", "dra.migMode=dynamic"), "dynamic"):
        docs = render("--set", "dra.enabled=true", *given)
        (driver,) = [d for d in of_kind(docs, "DaemonSet") if d["metadata"]["name"].endswith("dra")]
        assert container_env(driver)["DP_DRA_MIG_MODE"] == expected


@needs_helm
def test_the_mps_shared_namespaces_reach_the_driver_only_when_given() -> None:
    given = ("--set-string", "dra.mpsSharedNamespaces=a\\,b;c\\,d")
    for flags, expected in ((), None), (given, "a,b;c,d"):
        docs = render("--set", "dra.enabled=true", *flags)
        (driver,) = [d for d in of_kind(docs, "DaemonSet") if d["metadata"]["name"].endswith("dra")]
        assert container_env(driver).get("DP_DRA_MPS_SHARED_NAMESPACES") == expected


# --- migration.modeLabel: the device plugin or the DRA driver, per node ------------------------

BOTH = ("--set", "dra.enabled=true")
MODE_LABEL = ("--set", "migration.modeLabel=nvidia.com/dra")
PLUGIN_TERM = {"key": "nvidia.com/dra", "operator": "NotIn", "values": ["true"]}
DRIVER_TERM = {"key": "nvidia.com/dra", "operator": "Exists"}
MODE_LABEL_VALUES = ("--values", str(CHART / "ci" / "mode-label-values.yaml"))
POD_RESOURCES = "/var/lib/kubelet/pod-resources"


def pod_spec(ds: Doc) -> Doc:
    spec: Doc = ds["spec"]["template"]["spec"]
    return spec


def required_terms(ds: Doc) -> list[Doc]:
    node = pod_spec(ds)["affinity"]["nodeAffinity"]
    terms: list[Doc] = node["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return terms


def test_the_mode_label_is_off_by_default() -> None:
    assert VALUES["migration"] == {"modeLabel": ""}


@needs_helm
def test_without_the_mode_label_both_daemonsets_render_as_before() -> None:
    docs = render(*BOTH)
    for ds in (plugin(docs), driver(docs)):
        assert "affinity" not in pod_spec(ds)
        assert pod_spec(ds)["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    given = yaml.safe_load((CHART / "ci" / "mode-label-values.yaml").read_text())["affinity"]
    docs = render(*MODE_LABEL_VALUES, "--set", "migration.modeLabel=")
    for ds in (plugin(docs), driver(docs)):
        assert pod_spec(ds)["affinity"] == given


@needs_helm
def test_the_mode_label_keeps_the_plugin_off_and_the_driver_on_labelled_nodes() -> None:
    docs = render(*BOTH, *MODE_LABEL)
    for ds, expression in ((plugin(docs), PLUGIN_TERM), (driver(docs), DRIVER_TERM)):
        assert pod_spec(ds)["affinity"] == {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [expression]}]
                }
            }
        }
        assert pod_spec(ds)["nodeSelector"] == {"nvidia.com/gpu.present": "true"}


@needs_helm
@pytest.mark.parametrize("label", [None, "true", "false"], ids=["absent", "true", "false"])
@pytest.mark.parametrize("args", [MODE_LABEL, MODE_LABEL_VALUES], ids=["alone", "merged"])
def test_with_the_mode_label_a_labelled_node_has_the_driver_and_only_true_lacks_the_plugin(
    args: tuple[str, ...], label: str | None
) -> None:
    """`true`: the DRA driver alone; absent: the device plugin alone; `false` (moved back): the
    device plugin, with the driver beside it to release the claims it prepared."""
    docs = render(*BOTH, *args)
    labels = {"nvidia.com/gpu.present": "true", "topology.kubernetes.io/zone": "zone-a"}
    if label is not None:
        labels["nvidia.com/dra"] = label
    assert runs_on(plugin(docs), labels) is (label != "true")
    assert runs_on(driver(docs), labels) is (label is not None)


@needs_helm
def test_the_mode_label_is_anded_into_every_term_of_ones_own_affinity() -> None:
    docs = render(*MODE_LABEL_VALUES)
    given = yaml.safe_load((CHART / "ci" / "mode-label-values.yaml").read_text())["affinity"]
    given_terms = given["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    for ds, label in ((plugin(docs), PLUGIN_TERM), (driver(docs), DRIVER_TERM)):
        # each DaemonSet its own term only: rendering one leaves the values as they were
        assert required_terms(ds) == [
            {"matchExpressions": [*term["matchExpressions"], label]}
            for term in given_terms["nodeSelectorTerms"]
        ]
        node = pod_spec(ds)["affinity"]["nodeAffinity"]
        preferred = "preferredDuringSchedulingIgnoredDuringExecution"
        assert node[preferred] == given["nodeAffinity"][preferred]
        # the other term (ORed) carries the label too: a node it picks is not given to both
        pool = {"nvidia.com/gpu.present": "true", "example.com/node-pool": "gpu"}
        assert runs_on(ds, pool | {"nvidia.com/dra": "true"}) is (label is DRIVER_TERM)
        assert runs_on(ds, pool) is (label is PLUGIN_TERM)
        assert not runs_on(ds, {"nvidia.com/gpu.present": "true"})  # neither term: neither


@needs_helm
def test_both_daemonsets_read_the_pod_resources_api_and_cannot_write_there() -> None:
    docs = render(*BOTH)
    for ds in (plugin(docs), driver(docs)):
        spec = pod_spec(ds)
        (volume,) = [
            v for v in spec["volumes"] if v.get("hostPath", {}).get("path") == POD_RESOURCES
        ]
        assert volume["hostPath"]["type"] == "Directory"
        mounts = [m for m in spec["containers"][0]["volumeMounts"] if m["name"] == volume["name"]]
        assert mounts == [{"name": volume["name"], "mountPath": POD_RESOURCES, "readOnly": True}]
