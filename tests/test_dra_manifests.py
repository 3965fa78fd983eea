"""manifests/dra: valid for every Kubernetes release that serves resource.k8s.io/v1, least
privilege (the verbs the driver's API calls use, and a ValidatingAdmissionPolicy that keeps its
slice writes to its own node), the host paths the DRA driver needs, DeviceClasses that `dra
explain` reads (the CEL compiles, the extended resource names are valid), the seed's template in
v1beta1, and the overlays that give each node to one of the device plugin and the DRA driver by
its nvidia.com/dra label."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from nodeplacement import merge_patch, runs_on

from deviceplugin.cli import parse_options
from deviceplugin.dra.kubeapi import KubeApi
from deviceplugin.explain.resourceapi import read_claims, read_classes
from deviceplugin.model.slices import build_slices
from deviceplugin.runtime.options import DEFAULT_DRA_DRIVER, DraServeOptions

ROOT = Path(__file__).resolve().parent.parent
DRA = ROOT / "manifests" / "dra"
VERSIONS = ("1.34", "1.35", "1.36", "1.37")


def documents() -> list[tuple[str, dict[str, Any]]]:
    return [
        (path.name, document)
        for path in sorted(DRA.glob("*.yaml"))
        for document in yaml.safe_load_all(path.read_text())
        if document
    ]


def of_kind(kind: str) -> list[dict[str, Any]]:
    return [document for _, document in documents() if document["kind"] == kind]


@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_is_valid(version: str) -> None:
    assert len(documents()) >= 8
    for name, document in documents():
        assert kubernetes_validate.validate(document, version, strict=True) == version, name


def test_resource_v1_is_not_served_before_1_34() -> None:
    (seed, *_) = (c for c in of_kind("DeviceClass") if c["apiVersion"] == "resource.k8s.io/v1")
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        kubernetes_validate.validate(seed, "1.33", strict=True)


# Each API call of the driver (deviceplugin/dra/kubeapi.py) and the verb it needs.
VERBS = {
    "list_slices": ("resource.k8s.io", "resourceslices", "list"),
    "watch_slices": ("resource.k8s.io", "resourceslices", "watch"),
    "create_slice": ("resource.k8s.io", "resourceslices", "create"),
    "dry_run_slice": ("resource.k8s.io", "resourceslices", "create"),  # the server-feature probe
    "replace_slice": ("resource.k8s.io", "resourceslices", "update"),
    "delete_slice": ("resource.k8s.io", "resourceslices", "delete"),
    "read_claim": ("resource.k8s.io", "resourceclaims", "get"),
}
# Calls no role needs to grant: `/version`, which the built-in system:public-info-viewer
# ClusterRole grants every client.
PUBLIC = {"server_version"}


def test_the_role_grants_the_verbs_of_the_drivers_calls_and_nothing_more() -> None:
    calls = {n for n in vars(KubeApi) if not n.startswith("_")} - {"close", "unreachable"}
    assert calls == set(VERBS) | PUBLIC, "a call was added or removed: update VERBS and rbac.yaml"
    wanted: dict[tuple[str, str], set[str]] = {}
    for group, resource, verb in VERBS.values():
        wanted.setdefault((group, resource), set()).add(verb)
    (role,) = of_kind("ClusterRole")
    grants = {
        (group, resource): sorted(rule["verbs"])
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    assert grants == {key: sorted(verbs) for key, verbs in wanted.items()}
    (binding,) = of_kind("ClusterRoleBinding")
    (account,) = of_kind("ServiceAccount")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": account["metadata"]["name"],
            "namespace": account["metadata"]["namespace"],
        }
    ]


def test_slice_writes_are_kept_to_the_drivers_own_node_by_an_admission_policy() -> None:
    (policy,) = of_kind("ValidatingAdmissionPolicy")
    (binding,) = of_kind("ValidatingAdmissionPolicyBinding")
    (account,) = of_kind("ServiceAccount")
    (daemonset,) = of_kind("DaemonSet")
    assert binding["spec"] == {
        "policyName": policy["metadata"]["name"],
        "validationActions": ["Deny"],
    }
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"]["resourceRules"] == [
        {
            "apiGroups": ["resource.k8s.io"],
            "apiVersions": ["*"],
            "operations": ["CREATE", "UPDATE", "DELETE"],
            "resources": ["resourceslices"],
        }
    ]
    # requests of the driver's service account, and of nobody else
    assert (
        daemonset["spec"]["template"]["spec"]["serviceAccountName"] == account["metadata"]["name"]
    )
    user = f"system:serviceaccount:{account['metadata']['namespace']}:{account['metadata']['name']}"
    (condition,) = spec["matchConditions"]
    assert condition["expression"] == f"request.userInfo.username == '{user}'"
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    assert "'authentication.kubernetes.io/node-name'" in variables["node"]
    # create: the new slice; delete: the old one; update: both
    assert variables["slices"] == (
        "request.operation == 'CREATE' ? [object] : "
        "request.operation == 'DELETE' ? [oldObject] : [object, oldObject]"
    )
    rules = [v["expression"] for v in spec["validations"]]
    assert rules == [
        "variables.node != ''",
        "variables.slices.all(s, s.spec.?nodeName.orValue('') == variables.node)",
        "variables.slices.all(s, s.spec.pool.name == variables.node)",
        f"variables.slices.all(s, s.spec.driver == '{DEFAULT_DRA_DRIVER}')",
    ]
    assert {v["reason"] for v in spec["validations"]} == {"Forbidden"}
    # the driver as deployed publishes under the default name, the one the policy allows
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    settings = parse_options(container["command"][1:], env)
    assert isinstance(settings, DraServeOptions)
    assert settings.driver_name == DEFAULT_DRA_DRIVER
    assert settings.mps_shared_namespaces == ()  # no namespaces share an MPS daemon


def test_the_policy_lets_through_the_pool_the_driver_publishes() -> None:
    """The policy pins spec.nodeName and spec.pool.name to the token's node: every slice the
    driver writes, those of shared counters (dynamic MIG) included, names its node both ways."""
    counter_set = {"name": "gpu-0-counters", "counters": {"memory": {"value": "80Gi"}}}
    devices = [{"name": f"gpu-{n}"} for n in range(200)]
    slices = build_slices("node-7", devices, 3, DEFAULT_DRA_DRIVER, [counter_set])
    assert [bool(s["spec"].get("sharedCounters")) for s in slices] == [True, False, False]
    assert {(s["spec"]["nodeName"], s["spec"]["pool"]["name"]) for s in slices} == {
        ("node-7", "node-7")
    }


def test_the_kustomization_applies_every_manifest_of_the_driver() -> None:
    kustomization = yaml.safe_load((DRA / "Kustomization").read_text())
    assert {"rbac.yaml", "node-restriction.yaml", "daemonset.yaml"} <= set(
        kustomization["resources"]
    )


def test_the_daemonset_mounts_what_the_driver_needs_and_holds_no_privilege() -> None:
    (daemonset,) = of_kind("DaemonSet")
    pod = daemonset["spec"]["template"]["spec"]
    (account,) = of_kind("ServiceAccount")
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    host_paths = {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert host_paths == {
        "/var/lib/kubelet/plugins_registry",
        "/var/lib/kubelet/plugins/gpu.nvidia.com",
        "/var/run/cdi",
        "/var/lib/kubelet/device-plugins",
        "/var/lib/kubelet/pod-resources",
    }
    (container,) = pod["containers"]
    looked_at = {
        m["mountPath"]: m.get("readOnly")
        for m in container["volumeMounts"]
        if m["mountPath"].startswith(("/var/lib/kubelet/device-plugins", "/var/lib/kubelet/pod"))
    }
    # only looked at: is a device plugin there, and what do running pods hold of its devices?
    assert looked_at == {
        "/var/lib/kubelet/device-plugins": True,
        "/var/lib/kubelet/pod-resources": True,
    }
    assert container["command"] == ["deviceplugin", "dra", "serve"]
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert host_paths <= mounts
    security = container["securityContext"]
    assert security["privileged"] is False
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert "hostNetwork" not in pod and "hostPID" not in pod


def test_the_daemonset_probes_the_http_endpoints_dra_serve_is_told_to_serve() -> None:
    (daemonset,) = of_kind("DaemonSet")
    template = daemonset["spec"]["template"]
    (container,) = template["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    settings = parse_options(container["command"][1:], env)
    assert isinstance(settings, DraServeOptions)
    assert settings.http_address is not None
    host, _, port = settings.http_address.rpartition(":")
    assert host in ("0.0.0.0", "[::]", ""), "kubelet probes come over the pod IP"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["metrics"] == int(port)
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert template["metadata"]["annotations"]["prometheus.io/port"] == port


def test_device_classes_of_the_seed_and_nvidia_and_for_extended_resources_are_valid() -> None:
    classes = read_classes(of_kind("DeviceClass"), "manifests/dra")
    assert set(classes) == {
        "mig-1g.10gb.nvidia.com",
        "gpu.nvidia.com",
        "mig.nvidia.com",
        "gpu-extended.nvidia.com",
        "mig-1g.10gb-extended.nvidia.com",
        "gpu-shared.nvidia.com",
        "gpu-shared-extended.nvidia.com",
    }
    extended = {n: c.extended_resource_name for n, c in classes.items() if c.extended_resource_name}
    assert extended == {
        "gpu-extended.nvidia.com": "nvidia.com/gpu",
        "mig-1g.10gb-extended.nvidia.com": "nvidia.com/mig-1g.10gb",
        "gpu-shared-extended.nvidia.com": "nvidia.com/gpu.shared",
    }


def test_the_extended_resource_classes_live_apart_from_the_others() -> None:
    """Applying deviceclasses.yaml alone must not take nvidia.com/gpu pods away from a device
    plugin elsewhere; the extended-resource classes are a step of the migration."""
    base = list(yaml.safe_load_all((DRA / "deviceclasses.yaml").read_text()))
    assert not any("extendedResourceName" in c["spec"] for c in base)


def test_the_seed_template_is_there_in_both_shapes() -> None:
    templates = {t.name: t for t in read_claims(of_kind("ResourceClaimTemplate"), "manifests/dra")}
    v1, v1beta1 = templates["mig-1g.10gb"], templates["mig-1g.10gb-v1beta1"]
    assert v1.api_version == "resource.k8s.io/v1"
    assert v1beta1.api_version == "resource.k8s.io/v1beta1"
    assert v1.requests == v1beta1.requests


def test_the_daemonset_runs_the_dra_image_of_this_version() -> None:
    """`make image-dra` builds `deviceplugin:<version>-dra` (the plugin's image has no
    Kubernetes client, so `dra serve` would exit with startup.missing_dependency there)."""
    import tomllib

    pyproject = ROOT / "pyproject.toml"
    version = tomllib.loads(pyproject.read_text())["project"]["version"]
    (daemonset,) = of_kind("DaemonSet")
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"deviceplugin:{version}-dra"
    makefile = (ROOT / "Makefile").read_text()
    assert "DRA_IMAGE ?= deviceplugin:$(VERSION)-dra" in makefile
    assert "'[dra]'" in makefile


# --- the nvidia.com/dra label: the device plugin or the DRA driver, per node --------------------

LABEL_OVERLAYS = ROOT / "manifests" / "overlays" / "dra-label"


def lists_only_where_the_base_has_none(base: Any, patch: Any) -> bool:
    """A strategic merge patch is a plain merge where the base has no list the patch sets."""
    if isinstance(patch, list):
        return base is None
    if isinstance(patch, dict):
        base = base or {}
        return all(lists_only_where_the_base_has_none(base.get(k), v) for k, v in patch.items())
    return True


def overlaid(name: str) -> dict[str, Any]:
    """The DaemonSet manifests/overlays/dra-label/<name> applies: its base's, patched."""
    overlay = LABEL_OVERLAYS / name
    kustomization = yaml.safe_load((overlay / "kustomization.yaml").read_text())
    (base_dir,) = (overlay / base for base in kustomization["resources"])
    base = yaml.safe_load((base_dir / "Kustomization").read_text())
    (daemonset,) = (
        document
        for resource in base["resources"]
        if resource.endswith(".yaml")
        for document in yaml.safe_load_all((base_dir / resource).read_text())
        if document and document["kind"] == "DaemonSet"
    )
    (entry,) = kustomization["patches"]
    patch = yaml.safe_load((overlay / entry["path"]).read_text())
    assert (patch["apiVersion"], patch["kind"]) == (daemonset["apiVersion"], daemonset["kind"])
    assert patch["metadata"] == {k: daemonset["metadata"][k] for k in ("name", "namespace")}
    assert lists_only_where_the_base_has_none(daemonset, patch)
    patched: dict[str, Any] = merge_patch(daemonset, patch)
    return patched


@pytest.mark.parametrize("label", [None, "true", "false"], ids=["absent", "true", "false"])
def test_the_label_gives_true_to_the_driver_alone_and_keeps_it_beside_the_plugin_on_false(
    label: str | None,
) -> None:
    plugin, driver = overlaid("deviceplugin"), overlaid("dra")
    assert plugin["metadata"]["name"] == "deviceplugin"
    assert driver["metadata"]["name"] == "deviceplugin-dra"
    labels = {"nvidia.com/gpu.present": "true"}
    if label is not None:
        labels["nvidia.com/dra"] = label
    assert runs_on(plugin, labels) is (label != "true")
    assert runs_on(driver, labels) is (label is not None)
    # a node without GPUs gets neither, whatever the label
    del labels["nvidia.com/gpu.present"]
    assert not runs_on(plugin, labels) and not runs_on(driver, labels)


def test_the_docs_name_only_manifests_that_exist() -> None:
    """The README's, docs/helm.md's and the DRA pages' steps point at files to apply and patch:
    each must be there."""
    docs = ROOT / "docs"
    pages = [ROOT / "README.md", docs / "helm.md", docs / "dra.md", *sorted(docs.glob("dra/*.md"))]
    text = "".join(page.read_text() for page in pages)
    named = {path.rstrip(".") for path in re.findall(r"manifests/[\w./-]+", text)}
    assert "manifests/overlays/dra-label/deviceplugin/off-dra-nodes.yaml" in named
    assert [path for path in sorted(named) if not (ROOT / path).exists()] == []
