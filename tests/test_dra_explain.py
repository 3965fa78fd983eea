"""dra.selectors, dra.claims and `deviceplugin dra explain`: CEL selectors on the devices a node
publishes, the seed DeviceClass's exact choice with default flags, Kubernetes' CEL extensions,
and the scheduler's allocation: count, `allocationMode: All`, `firstAvailable`, selectors,
`matchAttribute` and `distinctAttribute`, taints and tolerations, `adminAccess`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from deviceplugin.__main__ import main
from deviceplugin.explain.claims import Candidate, allocate
from deviceplugin.explain.command import ExplainOptions, node_devices
from deviceplugin.explain.resourceapi import (
    Claim,
    Constraint,
    DeviceChoice,
    DeviceClass,
    Request,
    Toleration,
    read_claims,
)
from deviceplugin.explain.selectors import Selector, SelectorError, cel_device, parse_quantity
from deviceplugin.model.slices import build_devices, device_name
from tests.dranode import inventory
from tests.draplugin import PRESET, published, run, running_driver

MANIFESTS = Path(__file__).resolve().parent.parent / "manifests" / "dra"
CLASSES = MANIFESTS / "deviceclasses.yaml"
SEED_CLASS = "mig-1g.10gb.nvidia.com"
SEED_TEMPLATE_V1 = MANIFESTS / "resourceclaimtemplate-mig-1g.10gb.yaml"
SEED_TEMPLATE_V1BETA1 = MANIFESTS / "resourceclaimtemplate-mig-1g.10gb-v1beta1.yaml"
# The seed's selector as the issue states it, without the driver guard of our manifest.
SEED_BARE = (
    "device.attributes['nvidia.com'].migProfile == '1g.10gb' && "
    "device.attributes['nvidia.com'].healthy"
)


def devices(preset: str, **unhealthy: str) -> dict[str, Any]:
    published = build_devices(inventory(preset), unhealthy)
    return {d["name"]: cel_device("gpu.nvidia.com", d) for d in published}


def candidates(preset: str, unhealthy: dict[str, str] | None = None) -> list[Candidate]:
    return [Candidate.of("gpu.nvidia.com", d) for d in build_devices(inventory(preset), unhealthy)]


def explain(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    code = main(["dra", "explain", "--class", str(CLASSES), "-o", "json", *args])
    out = capsys.readouterr().out
    assert code == 0, out
    report: dict[str, Any] = json.loads(out)
    return report


def manifest_class(name: str) -> DeviceClass:
    for document in yaml.safe_load_all(CLASSES.read_text()):
        if document["metadata"]["name"] == name:
            expression: str = document["spec"]["selectors"][0]["cel"]["expression"]
            return DeviceClass(name, (Selector(expression),))
    raise AssertionError(name)


def exact(name: str, device_class: str, count: int | None = 1, **fields: Any) -> Request:
    return Request(name, (DeviceChoice(name, device_class, count=count, **fields),))


def claim(*requests: Request, constraints: tuple[Constraint, ...] = ()) -> Claim:
    return Claim("ResourceClaim", "resource.k8s.io/v1", "c", requests, constraints)


def write(path: Path, *documents: dict[str, Any]) -> str:
    path.write_text(yaml.safe_dump_all(documents))
    return str(path)


def v1_claim(name: str, requests: list[dict[str, Any]], **devices: Any) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": requests, **devices}},
    }


@pytest.mark.parametrize("preset", ["a100-80gb-x8-mixed", "a30-x4-mig", "h100-x8"])
def test_the_seed_class_selects_exactly_the_healthy_1g_10gb_devices(preset: str) -> None:
    found = inventory(preset)
    sick = {m.uuid: "xid-94" for g in found.gpus[:1] for m in g.mig_devices[:2]}
    sick[found.gpus[-1].uuid] = "xid-79"
    published = build_devices(found, sick)
    expected = {
        mig.uuid
        for gpu in found.gpus
        if gpu.mig_enabled and gpu.uuid not in sick
        for mig in gpu.mig_devices
        if mig.profile == "1g.10gb" and mig.uuid not in sick
    }
    seed = manifest_class(SEED_CLASS).selectors[0].expression
    for expression in (SEED_BARE, seed):
        selector = Selector(expression)
        chosen = {
            d["attributes"]["uuid"]["string"]
            for d in published
            if selector.matches(cel_device("gpu.nvidia.com", d))
        }
        assert chosen == expected
    if preset == "a100-80gb-x8-mixed":
        assert len(expected) == 26  # 28 less GPU 0's two sick ones (GPU 7 is whole)


def test_nvidias_classes_select_by_type() -> None:
    on_node = devices("a100-80gb-x8-mixed")
    gpus = manifest_class("gpu.nvidia.com").selectors[0]
    mig_devices = manifest_class("mig.nvidia.com").selectors[0]
    assert sum(gpus.matches(d) for d in on_node.values()) == 4
    assert sum(mig_devices.matches(d) for d in on_node.values()) == 28


@pytest.mark.parametrize(
    ("expression", "matching"),
    [
        ("device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0", 4),
        ("device.capacity['gpu.nvidia.com'].memory.isLessThan(quantity('10Gi'))", 28),
        ("device.capacity['gpu.nvidia.com'].memory.asInteger() > 10 * 1024 * 1024 * 1024", 4),
        ("device.attributes['gpu.nvidia.com'].driverVersion.isGreaterThan(semver('535.0.0'))", 32),
        ("device.attributes['gpu.nvidia.com'].driverVersion.compareTo(semver('560.0.0')) < 0", 32),
        ("device.attributes['gpu.nvidia.com'].cudaComputeCapability.major() >= 9", 0),
        ("isSemver('1.2.3') && !isSemver('1.2') && isQuantity('80Gi')", 32),
        ("has(device.attributes['other.example.com'].anything)", 0),
        ("!has(device.attributes['gpu.nvidia.com'].profile)", 4),
        (
            "cel.bind(a, device.attributes['gpu.nvidia.com'],"
            " a.productName.lowerAscii().contains('a100'))",
            32,
        ),
        ("device.attributes['nvidia.com'].numaNode == 1", 4),
        ("device.attributes['resource.kubernetes.io'].numaNode == 1", 4),
        ("device.attributes['resource.kubernetes.io'].pciBusID.startsWith('0000:')", 32),
        ("device.attributes['gpu.nvidia.com'].pcieBusID.startsWith('0000:')", 32),
        (
            "has(device.attributes['gpu.nvidia.com'].parentIndex) &&"
            " device.attributes['gpu.nvidia.com'].parentIndex == 2",
            7,
        ),
    ],
)
def test_kubernetes_cel_extensions(expression: str, matching: int) -> None:
    selector = Selector(expression)
    assert sum(selector.matches(d) for d in devices("a100-80gb-x8-mixed").values()) == matching


def test_reading_a_missing_attribute_is_an_error_as_in_kubernetes() -> None:
    whole_gpu = devices("h100-x8")["gpu-0"]
    with pytest.raises(SelectorError, match="profile"):
        Selector("device.attributes['gpu.nvidia.com'].profile == '1g.10gb'").matches(whole_gpu)
    with pytest.raises(SelectorError, match="not a bool"):
        Selector("1 + 1").matches(whole_gpu)
    with pytest.raises(SelectorError, match="compile"):
        Selector("device.attributes[")


@pytest.mark.parametrize(
    ("text", "value"),
    [("10Gi", 10 << 30), ("1.5Gi", 3 << 29), ("500m", 1), ("2k", 2000), ("1e3", 1000), ("7", 7)],
)
def test_quantities(text: str, value: int) -> None:
    assert parse_quantity(text) == value


# --- allocation ---------------------------------------------------------------------------------


def test_count_with_match_attribute_keeps_a_group_on_one_gpu() -> None:
    on_node = candidates("a100-80gb-x8-mixed")
    seed = {SEED_CLASS: manifest_class(SEED_CLASS)}
    pair = claim(exact("migs", SEED_CLASS, 3), constraints=(Constraint("nvidia.com/parentUUID"),))
    allocation = allocate(pair, seed, on_node)
    assert allocation.failure == ""
    chosen = allocation.devices["migs"]
    by_name = {c.name: c for c in on_node}
    parents = {by_name[d].cel["attributes"]["nvidia.com"]["parentUUID"] for d in chosen}
    assert len(chosen) == 3 and len(parents) == 1
    assert allocation.values == {"nvidia.com/parentUUID": parents.pop()}


def test_match_attribute_skips_a_gpu_that_cannot_hold_the_whole_group() -> None:
    found = inventory("a100-80gb-x8-mixed")
    sick = {m.uuid: "xid-94" for m in found.gpus[0].mig_devices[:2]}  # GPU 0 keeps 5
    on_node = candidates("a100-80gb-x8-mixed", sick)
    seed = {SEED_CLASS: manifest_class(SEED_CLASS)}
    same_gpu = (Constraint("nvidia.com/parentUUID"),)
    allocation = allocate(claim(exact("migs", SEED_CLASS, 6), constraints=same_gpu), seed, on_node)
    assert {d.split("-mig-")[0] for d in allocation.devices["migs"]} == {"gpu-1"}
    eight = allocate(claim(exact("migs", SEED_CLASS, 8), constraints=same_gpu), seed, on_node)
    assert "matchAttribute nvidia.com/parentUUID" in eight.failure
    assert "migs: 8 wanted, 26 match" in eight.failure
    unconstrained = allocate(claim(exact("migs", SEED_CLASS, 8)), seed, on_node)
    assert len(unconstrained.devices["migs"]) == 8


def test_distinct_attribute_spreads_a_group_over_gpus() -> None:
    seed = {SEED_CLASS: manifest_class(SEED_CLASS)}
    spread = claim(
        exact("migs", SEED_CLASS, 4),
        constraints=(Constraint("nvidia.com/parentUUID", distinct=True),),
    )
    allocation = allocate(spread, seed, candidates("a100-80gb-x8-mixed"))
    assert allocation.devices["migs"] == (
        "gpu-0-mig-7-0",
        "gpu-1-mig-7-0",
        "gpu-2-mig-7-0",
        "gpu-3-mig-7-0",
    )
    five = claim(exact("migs", SEED_CLASS, 5), constraints=spread.constraints)
    assert "distinctAttribute" in allocate(five, seed, candidates("a100-80gb-x8-mixed")).failure


def test_match_attribute_across_requests_and_all_mode() -> None:
    on_node = candidates("a10-x8")
    gpus = {"gpu.nvidia.com": manifest_class("gpu.nvidia.com")}
    numa = (Constraint("nvidia.com/numaNode"),)
    two = claim(exact("a", "gpu.nvidia.com", 1), exact("b", "gpu.nvidia.com", 3), constraints=numa)
    allocation = allocate(two, gpus, on_node)
    chosen = [*allocation.devices["a"], *allocation.devices["b"]]
    by_name = {c.name: c for c in on_node}
    assert len(set(chosen)) == 4
    assert len({by_name[d].cel["attributes"]["nvidia.com"]["numaNode"] for d in chosen}) == 1
    island = claim(
        exact("a", "gpu.nvidia.com", 2), constraints=(Constraint("nvidia.com/nvlinkIsland"),)
    )
    assert allocate(island, gpus, on_node).failure  # no NVLink on an A10 node
    every = claim(exact("a", "gpu.nvidia.com", None))
    assert len(allocate(every, gpus, on_node).devices["a"]) == 8


def test_a_later_request_makes_an_earlier_one_give_way() -> None:
    """The allocator backtracks: a first request that took the only device the second one can
    use gives it up for another."""
    on_node = candidates("a100-80gb-x8-mixed")
    first = on_node[0].cel["attributes"]["gpu.nvidia.com"]["uuid"]
    on_gpu_0 = Selector("device.attributes['gpu.nvidia.com'].parentIndex == 0")
    only_first = Selector(f"device.attributes['gpu.nvidia.com'].uuid == '{first}'")
    classes = {SEED_CLASS: manifest_class(SEED_CLASS)}
    wide = Request("wide", (DeviceChoice("wide", SEED_CLASS, selectors=(on_gpu_0,)),))
    narrow = Request("narrow", (DeviceChoice("narrow", SEED_CLASS, selectors=(only_first,)),))
    allocation = allocate(claim(wide, narrow), classes, on_node)
    assert allocation.devices == {"wide": ("gpu-0-mig-8-0",), "narrow": ("gpu-0-mig-7-0",)}


def test_first_available_takes_the_first_subrequest_that_fits() -> None:
    on_node = candidates("a100-80gb-x8-mixed")
    classes = {n: manifest_class(n) for n in ("gpu.nvidia.com", SEED_CLASS)}
    five_gpus = DeviceChoice("gpu/five-gpus", "gpu.nvidia.com", count=5)
    two_migs = DeviceChoice("gpu/two-migs", SEED_CLASS, count=2)
    allocation = allocate(
        claim(Request("gpu", (five_gpus, two_migs), first_available=True)), classes, on_node
    )
    assert allocation.devices == {"gpu/two-migs": ("gpu-0-mig-7-0", "gpu-0-mig-8-0")}
    four_gpus = DeviceChoice("gpu/four-gpus", "gpu.nvidia.com", count=4)
    allocation = allocate(
        claim(Request("gpu", (four_gpus, two_migs), first_available=True)), classes, on_node
    )
    assert allocation.devices == {"gpu/four-gpus": ("gpu-4", "gpu-5", "gpu-6", "gpu-7")}


def test_a_tainted_device_needs_a_toleration_and_all_mode_needs_every_device() -> None:
    found = inventory("a30-x4-mig")
    sick_mig = found.gpus[1].mig_devices[0]
    on_node = candidates("a30-x4-mig", {sick_mig.uuid: "xid-94"})
    migs_class = {"mig.nvidia.com": manifest_class("mig.nvidia.com")}
    every = claim(exact("all", "mig.nvidia.com", None))
    refused = allocate(every, migs_class, on_node)
    assert "1 tainted without a toleration" in refused.failure
    tolerant = DeviceChoice(
        "all",
        "mig.nvidia.com",
        count=None,
        tolerations=(Toleration(key="gpu.nvidia.com/unhealthy", operator="Exists"),),
    )
    assert (
        len(allocate(claim(Request("all", (tolerant,))), migs_class, on_node).devices["all"]) == 16
    )
    sixteen = allocate(claim(exact("n", "mig.nvidia.com", 16)), migs_class, on_node)
    assert "16 wanted, 16 match (1 tainted without a toleration)" in sixteen.failure
    fifteen = allocate(claim(exact("n", "mig.nvidia.com", 15)), migs_class, on_node)
    assert sick_mig.uuid not in {
        c.cel["attributes"]["gpu.nvidia.com"]["uuid"]
        for c in on_node
        if c.name in fifteen.devices["n"]
    }
    wrong_value = Toleration(key="gpu.nvidia.com/unhealthy", value="xid-79")
    assert not wrong_value.tolerates({"key": "gpu.nvidia.com/unhealthy", "value": "xid-94"})
    no_execute_only = Toleration(operator="Exists", effect="NoExecute")
    assert not no_execute_only.tolerates({"key": "k", "effect": "NoSchedule"})


def test_a_claim_gets_at_most_32_devices() -> None:
    on_node = candidates("a100-80gb-x8-mixed")
    every = {"all": DeviceClass("all", (Selector("true"),))}
    assert len(allocate(claim(exact("a", "all", 32)), every, on_node).devices["a"]) == 32
    assert allocate(claim(exact("a", "all", None)), every, on_node).devices["a"]
    too_many = allocate(claim(exact("a", "all", 33)), every, on_node).failure
    assert "a: 33 wanted, 32 match (a claim gets at most 32 devices)" in too_many
    big = [
        Candidate(f"d-{n}", "x", {"driver": "x", "attributes": {}, "capacity": {}}, {})
        for n in range(40)
    ]
    assert "at most 32" in allocate(claim(exact("a", "all", None)), every, big).failure


# --- dra explain, end to end --------------------------------------------------------------------


@pytest.mark.parametrize("template", [SEED_TEMPLATE_V1BETA1, SEED_TEMPLATE_V1])
def test_the_seed_class_and_template_with_default_flags(
    capsys: pytest.CaptureFixture[str], template: Path
) -> None:
    """The issue's check: both shapes of the seed's template, default flags, the MIG node."""
    report = explain(capsys, "--simulate", "a100-80gb-x8-mixed", "--claim", str(template))
    seed = report["classes"][SEED_CLASS]
    assert sum(v is True for v in seed.values()) == 28
    (allocated,) = report["claims"]
    assert allocated["failure"] == ""
    assert allocated["devices"] == {"mig": ["gpu-0-mig-7-0"]}
    assert seed[allocated["devices"]["mig"][0]] is True


def test_the_published_devices_do_not_depend_on_the_device_plugin_config(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    reports = []
    for strategy in ("none", "single", "mixed"):
        config = tmp_path / f"{strategy}.yaml"
        config.write_text(
            f"version: v1\nflags:\n  migStrategy: {strategy}\nsharing:\n  timeSlicing:\n"
            "    resources:\n      - name: nvidia.com/gpu\n        replicas: 4\n"
        )
        reports.append(
            explain(capsys, "--simulate", "a100-80gb-x8-mixed", "--config-file", str(config))
        )
    assert reports[0] == reports[1] == reports[2]
    assert len(reports[0]["devices"]) == 32


@pytest.mark.parametrize(
    "flag", ["--mig-strategy", "--device-list-strategy", "--pass-device-specs"]
)
@pytest.mark.parametrize("command", [["serve"], ["explain", "--class", str(CLASSES)]])
def test_device_plugin_flags_are_a_usage_error(
    capsys: pytest.CaptureFixture[str], command: list[str], flag: str
) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["dra", *command, flag, "mixed"])
    assert stopped.value.code == 2
    assert f"{flag} is a setting of the device plugin" in capsys.readouterr().err


def _as_version(document: dict[str, Any], version: str) -> dict[str, Any]:
    """A v1 object in the v1beta2 or v1beta1 shape, as a user would write it."""
    copy: dict[str, Any] = json.loads(json.dumps(document))
    copy["apiVersion"] = f"resource.k8s.io/{version}"
    if version == "v1beta1" and copy["kind"] != "DeviceClass":
        spec = copy["spec"]["spec"] if copy["kind"] == "ResourceClaimTemplate" else copy["spec"]
        for request in spec["devices"]["requests"]:
            request.update(request.pop("exactly", {}))
    return copy


@pytest.mark.parametrize("version", ["v1beta2", "v1beta1"])
def test_every_served_version_reads_the_same_as_v1(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, version: str
) -> None:
    pair = yaml.safe_load((MANIFESTS / "resourceclaim-mig-pair.yaml").read_text())
    classes = list(yaml.safe_load_all(CLASSES.read_text()))
    claims = [pair, next(yaml.safe_load_all(SEED_TEMPLATE_V1.read_text()))]
    v1 = explain(
        capsys, "--simulate", "a100-80gb-x8-mixed", "--claim", write(tmp_path / "v1.yaml", *claims)
    )
    converted = [_as_version(c, version) for c in claims]
    code = main(
        [
            "dra",
            "explain",
            "--class",
            write(tmp_path / "classes.yaml", *(_as_version(c, version) for c in classes)),
            "--claim",
            write(tmp_path / "other.yaml", *converted),
            "--simulate",
            "a100-80gb-x8-mixed",
            "-o",
            "json",
        ]
    )
    other = json.loads(capsys.readouterr().out)
    assert code == 0
    assert other["classes"] == v1["classes"]
    for before, after in zip(v1["claims"], other["claims"], strict=True):
        assert after["apiVersion"] == f"resource.k8s.io/{version}"
        assert {k: v for k, v in after.items() if k != "apiVersion"} == {
            k: v for k, v in before.items() if k != "apiVersion"
        }
    assert [c["devices"] for c in v1["claims"]] == [
        {"migs": ["gpu-0-mig-7-0", "gpu-0-mig-8-0"]},
        {"mig": ["gpu-0-mig-9-0"]},  # the pair's two are in use
    ]


def test_claims_in_one_file_hold_their_devices_unless_admin_access(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    every = v1_claim(
        "every",
        [
            {
                "name": "all",
                "exactly": {"deviceClassName": "mig.nvidia.com", "allocationMode": "All"},
            }
        ],
    )
    late = v1_claim("late", [{"name": "one", "exactly": {"deviceClassName": "mig.nvidia.com"}}])
    admin = v1_claim(
        "monitor",
        [{"name": "one", "exactly": {"deviceClassName": "mig.nvidia.com", "adminAccess": True}}],
    )
    path = write(tmp_path / "claims.yaml", every, late, admin)
    report = explain(capsys, "--simulate", "a30-x4-mig", "--claim", path)
    first, second, third = report["claims"]
    assert len(first["devices"]["all"]) == 16
    assert "1 wanted, 16 match (16 held by an earlier claim)" in second["failure"]
    assert third["failure"] == ""
    assert third["devices"] == {"one": ["gpu-0-mig-3-0"]} and third["adminAccess"] == ["one"]
    assert any("resource.kubernetes.io/admin-access=true" in n for n in third["notes"])


def test_the_unhealthy_taint_keeps_claims_off_a_device_unless_it_is_off(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    found = inventory("a30-x4-mig")
    first = found.gpus[0].mig_devices[0].uuid
    one = v1_claim("one", [{"name": "mig", "exactly": {"deviceClassName": "mig.nvidia.com"}}])
    path = write(tmp_path / "claim.yaml", one)
    args = ("--simulate", "a30-x4-mig", "--claim", path, "--unhealthy", first)
    tainted = explain(capsys, *args)
    assert tainted["claims"][0]["devices"] == {"mig": ["gpu-0-mig-4-0"]}
    assert tainted["devices"][0]["taints"][0]["effect"] == "NoSchedule"
    no_execute = explain(capsys, *args, "--unhealthy-taint", "NoExecute")
    assert no_execute["devices"][0]["taints"][0]["effect"] == "NoExecute"
    assert no_execute["claims"][0]["devices"] == {"mig": ["gpu-0-mig-4-0"]}
    untainted = explain(capsys, *args, "--unhealthy-taint", "off")
    assert untainted["devices"][0]["taints"] == []
    assert untainted["claims"][0]["devices"] == {"mig": ["gpu-0-mig-3-0"]}  # class ignores health


def test_after_an_xid_the_device_drops_out(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    found = inventory("a100-80gb-x8-mixed")
    mig = found.gpus[0].mig_devices[0]
    events = tmp_path / "events.jsonl"
    events.write_text(
        json.dumps({"uuid": mig.uuid, "xid": 94})
        + "\n"
        + json.dumps({"uuid": found.gpus[1].uuid, "xid": 13})
        + "\n"  # ignored by default
        + json.dumps({"uuid": found.gpus[2].uuid, "lost": True})
        + "\n"
    )
    report = explain(capsys, "--simulate", "a100-80gb-x8-mixed", "--simulate-events", str(events))
    seed = report["classes"][SEED_CLASS]
    assert seed["gpu-0-mig-7-0"] is False  # Xid 94 on that MIG device
    assert seed["gpu-0-mig-8-0"] is True
    assert seed["gpu-1-mig-7-0"] is True  # Xid 13 is not critical by default
    assert seed["gpu-2-mig-7-0"] is False  # its GPU fell off the bus
    assert sum(v is True for v in seed.values()) == 28 - 1 - 7
    healthy = {d["name"]: d["healthy"] for d in report["devices"]}
    assert not healthy["gpu-0-mig-7-0"] and healthy["gpu-1-mig-7-0"]
    again = explain(capsys, "--simulate", "a100-80gb-x8-mixed", "--unhealthy", found.gpus[3].uuid)
    assert sum(v is True for v in again["classes"][SEED_CLASS].values()) == 21


def test_explain_table(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["dra", "explain", "--class", str(CLASSES), "--simulate", "a30-x4-mig"]
    assert main([*args, "--claim", str(SEED_TEMPLATE_V1BETA1)]) == 0
    table = capsys.readouterr().out
    assert table.splitlines()[0].split() == [
        "DEVICE",
        "TYPE",
        "PROFILE",
        "HEALTHY",
        SEED_CLASS,
        "gpu.nvidia.com",
        "mig.nvidia.com",
    ]
    assert f"{SEED_CLASS}: 0 of 16 devices match" in table
    assert "ResourceClaimTemplate mig-1g.10gb-v1beta1 (resource.k8s.io/v1beta1): cannot be" in table
    assert "mig: 1 wanted, 0 match" in table


def test_claim_documents_are_read_from_the_manifests() -> None:
    (template,) = read_claims(list(yaml.safe_load_all(SEED_TEMPLATE_V1.read_text())), "t")
    (seed,) = read_claims(list(yaml.safe_load_all(SEED_TEMPLATE_V1BETA1.read_text())), "s")
    assert template.requests == seed.requests == (exact("mig", SEED_CLASS, 1),)
    (pair,) = read_claims(
        [yaml.safe_load((MANIFESTS / "resourceclaim-mig-pair.yaml").read_text())], "p"
    )
    assert pair.constraints == (Constraint("nvidia.com/parentUUID", ("migs",)),)


def test_explain_and_dra_serve_read_one_events_file_alike() -> None:
    """The same lines through the running driver's health monitor and through `dra explain`:
    a MIG device's Xid routed to it, a GPU-wide Xid on a MIG-enabled GPU, an ignored Xid, and an
    Xid on a GPU that fell off the bus (`gpu-lost`, not the Xid)."""
    found = inventory(PRESET)
    migs = [gpu for gpu in found.gpus if gpu.mig_enabled]
    wholes = [gpu for gpu in found.gpus if not gpu.mig_enabled]
    lines: list[dict[str, Any]] = [
        {"uuid": migs[0].mig_devices[0].uuid, "xid": 94},
        {"uuid": migs[1].uuid, "xid": 48},
        {"uuid": wholes[0].uuid, "xid": 13},
        {"uuid": wholes[1].uuid, "lost": True, "xid": 79},
    ]
    expected_unhealthy = 1 + len(migs[1].mig_devices) + 1

    def health(devices: list[dict[str, Any]]) -> dict[str, tuple[bool, list[str]]]:
        return {
            d["name"]: (
                d["attributes"]["nvidia.com/healthy"]["bool"],
                [t["value"] for t in d.get("taints", [])],
            )
            for d in devices
        }

    async def body() -> None:
        async with running_driver(recovery="off") as node:
            for line in lines:
                node.event(**line)

            def served() -> dict[str, tuple[bool, list[str]]]:
                return health(list(published(node.server).values()))

            await node.until(
                lambda: sum(not ok for ok, _ in served().values()) == expected_unhealthy, 30
            )
            options = ExplainOptions(
                class_file="", simulate=PRESET, events_file=str(node.events), env={}
            )
            explained = health(node_devices(options))
            assert explained == served()
            assert explained[device_name(wholes[1], None)] == (False, ["gpu-lost"])

    run(body)
