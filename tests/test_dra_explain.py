"""dra.selectors, dra.claims and `deviceplugin dra explain`: CEL selectors on the devices a node
publishes, the seed DeviceClass's exact choice, Kubernetes' CEL extensions, and allocation with
count and matchAttribute."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from deviceplugin.__main__ import main
from deviceplugin.dra.claims import Claim, Constraint, Request, allocate, read_claim
from deviceplugin.dra.selectors import Selector, SelectorError, cel_device, parse_quantity
from deviceplugin.model.slices import build_devices
from tests.dranode import inventory, plan

MANIFESTS = Path(__file__).resolve().parent.parent / "manifests" / "dra"
CLASSES = MANIFESTS / "deviceclasses.yaml"
SEED_CLASS = "mig-1g.10gb.nvidia.com"
# The seed's selector as the issue states it, without the driver guard of our manifest.
SEED_BARE = (
    "device.attributes['nvidia.com'].migProfile == '1g.10gb' && "
    "device.attributes['nvidia.com'].healthy"
)


def devices(preset: str, strategy: str = "mixed", **unhealthy: str) -> dict[str, Any]:
    found = inventory(preset)
    published = build_devices(found, plan(found, strategy, unhealthy))
    return {d["name"]: cel_device("gpu.nvidia.com", d) for d in published}


def uuids(chosen: dict[str, Any]) -> set[str]:
    return {d["attributes"]["gpu.nvidia.com"]["uuid"] for d in chosen.values()}


def explain(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    code = main(["dra", "explain", "--class", str(CLASSES), "-o", "json", *args])
    out = capsys.readouterr().out
    assert code == 0, out
    report: dict[str, Any] = json.loads(out)
    return report


@pytest.mark.parametrize("strategy", ["mixed", "none"])
@pytest.mark.parametrize("preset", ["a100-80gb-x8-mixed", "a30-x4-mig", "h100-x8"])
def test_the_seed_class_selects_exactly_the_healthy_1g_10gb_devices(
    preset: str, strategy: str
) -> None:
    found = inventory(preset)
    sick = {m.uuid: "xid-94" for g in found.gpus[:1] for m in g.mig_devices[:2]}
    sick[found.gpus[-1].uuid] = "xid-79"
    published = build_devices(found, plan(found, strategy, sick))
    expected = {
        mig.uuid
        for gpu in found.gpus
        if gpu.mig_enabled and strategy == "mixed" and gpu.uuid not in sick
        for mig in gpu.mig_devices
        if mig.profile == "1g.10gb" and mig.uuid not in sick
    }
    for expression in (SEED_BARE, _manifest_selector(SEED_CLASS)):
        selector = Selector(expression)
        chosen = {
            d["attributes"]["uuid"]["string"]
            for d in published
            if selector.matches(cel_device("gpu.nvidia.com", d))
        }
        assert chosen == expected
    if preset == "a100-80gb-x8-mixed" and strategy == "mixed":
        assert len(expected) == 26  # 28 less GPU 0's two sick ones (GPU 7 is whole)


def _manifest_selector(name: str) -> str:
    for document in yaml.safe_load_all(CLASSES.read_text()):
        if document["metadata"]["name"] == name:
            expression: str = document["spec"]["selectors"][0]["cel"]["expression"]
            return expression
    raise AssertionError(name)


def test_nvidias_classes_select_by_type() -> None:
    on_node = devices("a100-80gb-x8-mixed")
    gpus = Selector(_manifest_selector("gpu.nvidia.com"))
    migs = Selector(_manifest_selector("mig.nvidia.com"))
    assert sum(gpus.matches(d) for d in on_node.values()) == 4
    assert sum(migs.matches(d) for d in on_node.values()) == 28


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
        ("device.attributes['resource.kubernetes.io'].pciBusID.startsWith('0000:')", 32),
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


def test_count_with_match_attribute_keeps_a_group_on_one_gpu() -> None:
    on_node = devices("a100-80gb-x8-mixed")
    seed = {SEED_CLASS: (Selector(_manifest_selector(SEED_CLASS)),)}
    claim = Claim(
        "pair", (Request("migs", SEED_CLASS, (), 3),), (Constraint("nvidia.com/parentUUID", ()),)
    )
    allocation = allocate(claim, seed, on_node)
    assert allocation.failure == ""
    chosen = allocation.devices["migs"]
    parents = {on_node[d]["attributes"]["nvidia.com"]["parentUUID"] for d in chosen}
    assert len(chosen) == 3 and len(parents) == 1
    assert allocation.values == {"nvidia.com/parentUUID": parents.pop()}


def test_match_attribute_skips_a_gpu_that_cannot_hold_the_whole_group() -> None:
    found = inventory("a100-80gb-x8-mixed")
    sick = {m.uuid: "xid-94" for m in found.gpus[0].mig_devices[:2]}  # GPU 0 keeps 5
    on_node = devices("a100-80gb-x8-mixed", **sick)
    seed = {SEED_CLASS: (Selector(_manifest_selector(SEED_CLASS)),)}
    claim = Claim(
        "six", (Request("migs", SEED_CLASS, (), 6),), (Constraint("nvidia.com/parentUUID", ()),)
    )
    allocation = allocate(claim, seed, on_node)
    assert {
        on_node[d]["attributes"]["nvidia.com"]["parentUUID"] for d in allocation.devices["migs"]
    } == {found.gpus[1].uuid}
    eight = Claim(
        "eight", (Request("migs", SEED_CLASS, (), 8),), (Constraint("nvidia.com/parentUUID", ()),)
    )
    assert "matchAttribute nvidia.com/parentUUID" in allocate(eight, seed, on_node).failure
    unconstrained = Claim("eight", (Request("migs", SEED_CLASS, (), 8),))
    assert len(allocate(unconstrained, seed, on_node).devices["migs"]) == 8


def test_match_attribute_across_requests_and_all_mode() -> None:
    on_node = devices("a10-x8", "none")
    gpus = {"gpu.nvidia.com": (Selector(_manifest_selector("gpu.nvidia.com")),)}
    numa = Constraint("nvidia.com/numaNode", ())
    two_requests = Claim(
        "c", (Request("a", "gpu.nvidia.com", (), 1), Request("b", "gpu.nvidia.com", (), 3)), (numa,)
    )
    allocation = allocate(two_requests, gpus, on_node)
    chosen = [*allocation.devices["a"], *allocation.devices["b"]]
    assert len(set(chosen)) == 4
    assert len({on_node[d]["attributes"]["nvidia.com"]["numaNode"] for d in chosen}) == 1
    island = Claim(
        "c", (Request("a", "gpu.nvidia.com", (), 2),), (Constraint("nvidia.com/nvlinkIsland", ()),)
    )
    assert allocate(island, gpus, on_node).failure  # no NVLink on an A10 node
    every = Claim("c", (Request("a", "gpu.nvidia.com", (), None),))
    assert len(allocate(every, gpus, on_node).devices["a"]) == 8


def test_claim_documents_are_read_from_the_manifests() -> None:
    template = read_claim(
        next(yaml.safe_load_all((MANIFESTS / "resourceclaimtemplate-mig-1g.10gb.yaml").read_text()))
    )
    assert template.requests == (Request("mig", SEED_CLASS, (), 1),)
    pair = read_claim(yaml.safe_load((MANIFESTS / "resourceclaim-mig-pair.yaml").read_text()))
    assert pair.constraints == (Constraint("nvidia.com/parentUUID", ("migs",)),)


def test_explain_shows_the_seed_class_and_the_claim(capsys: pytest.CaptureFixture[str]) -> None:
    report = explain(
        capsys,
        "--simulate",
        "a100-80gb-x8-mixed",
        "--mig-strategy",
        "mixed",
        "--claim",
        str(MANIFESTS / "resourceclaim-mig-pair.yaml"),
    )
    seed = report["classes"][SEED_CLASS]
    assert sum(v is True for v in seed.values()) == 28
    assert sum(v is True for v in report["classes"]["gpu.nvidia.com"].values()) == 4
    claim = report["claim"]
    assert claim["failure"] == ""
    assert claim["devices"] == {"migs": ["gpu-0-mig-7-0", "gpu-0-mig-8-0"]}


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
    report = explain(
        capsys,
        "--simulate",
        "a100-80gb-x8-mixed",
        "--mig-strategy",
        "mixed",
        "--simulate-events",
        str(events),
    )
    seed = report["classes"][SEED_CLASS]
    assert seed["gpu-0-mig-7-0"] is False  # Xid 94 on that MIG device
    assert seed["gpu-0-mig-8-0"] is True
    assert seed["gpu-1-mig-7-0"] is True  # Xid 13 is not critical by default
    assert seed["gpu-2-mig-7-0"] is False  # its GPU fell off the bus
    assert sum(v is True for v in seed.values()) == 28 - 1 - 7
    healthy = {d["name"]: d["healthy"] for d in report["devices"]}
    assert not healthy["gpu-0-mig-7-0"] and healthy["gpu-1-mig-7-0"]
    again = explain(
        capsys,
        "--simulate",
        "a100-80gb-x8-mixed",
        "--mig-strategy",
        "mixed",
        "--unhealthy",
        found.gpus[3].uuid,
    )
    assert sum(v is True for v in again["classes"][SEED_CLASS].values()) == 21


def test_explain_table_and_bad_input(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["dra", "explain", "--class", str(CLASSES), "--simulate", "a30-x4-mig"]) == 0
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
    assert f"{SEED_CLASS}: 0 of 4 devices match" in table
    broken = tmp_path / "class.yaml"
    broken.write_text(
        "apiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata: {name: x}\n"
        "spec: {selectors: [{cel: {expression: 'device.('}}]}\n"
    )
    assert main(["dra", "explain", "--class", str(broken), "--simulate", "a30-x4-mig"]) == 2
    assert "does not compile" in capsys.readouterr().err
