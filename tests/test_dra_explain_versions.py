"""`dra explain --kubernetes-version`: the answer of an older release's API server and
scheduler with their default gates. On 1.35 the node publishes what `dra serve` publishes after
probing such a server (no partition, no share, no unhealthy device), and a claim loses the
fields that server drops, each named in a note; on 1.36 and 1.37 the answer is the newest one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from deviceplugin.__main__ import main
from tests.dranode import inventory

ROOT = Path(__file__).resolve().parent.parent
CLASSES = ROOT / "manifests" / "dra" / "deviceclasses.yaml"
SHARED_CLASSES = ROOT / "manifests" / "dra" / "deviceclasses-shares.yaml"
DYNAMIC = "a100-80gb-x8-dynamic"
A100 = "a100-80gb-x8-mixed"

JsonObject = dict[str, Any]


def claim(name: str, **exactly: Any) -> JsonObject:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


def explain(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, *args: str, claims: tuple[JsonObject, ...]
) -> JsonObject:
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump_all(claims))
    code = main(["dra", "explain", "--claim", str(path), "-o", "json", *args])
    out = capsys.readouterr().out
    assert code == 0, out
    report: JsonObject = json.loads(out)
    return report


def partition_claim() -> JsonObject:
    expression = "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"
    return claim(
        "one", deviceClassName="mig.nvidia.com", selectors=[{"cel": {"expression": expression}}]
    )


@pytest.mark.parametrize(
    ("version", "partitions"), [("1.35", False), ("1.34", False), ("1.36", True), ("v1.37", True)]
)
def test_dynamic_mig_publishes_partitions_only_where_counters_are_kept(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, version: str, partitions: bool
) -> None:
    args = ["--class", str(CLASSES), "--simulate", DYNAMIC, "--mig-mode", "dynamic"]
    report = explain(
        capsys, tmp_path, *args, "--kubernetes-version", version, claims=(partition_claim(),)
    )
    profiles = {d["profile"] for d in report["devices"] if d["profile"]}
    (one,) = report["claims"]
    if partitions:
        assert "1g.10gb" in profiles
        assert one["failure"] == ""
    else:
        # whole GPUs only: nothing the 1.35 scheduler could hand out twice
        assert profiles == set()
        assert len(report["devices"]) == len(inventory(DYNAMIC).gpus)
        assert one["failure"] != ""


def test_memory_shares_on_1_35_are_not_published_and_the_dropped_capacity_is_named(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    def share(name: str, device_class: str) -> JsonObject:
        asked = {"requests": {"memory": "20Gi"}}
        return claim(name, deviceClassName=device_class, capacity=asked)

    shares = (share("s0", "gpu-shared.nvidia.com"), share("s1", "gpu-shared.nvidia.com"))
    args = ["--class", str(SHARED_CLASSES), "--simulate", A100, "--gpu-sharing", "memory"]
    newest = explain(capsys, tmp_path, *args, claims=shares)
    # the newest scheduler puts both 20Gi shares on one GPU
    first, second = (c["results"] for c in newest["claims"])
    assert first[0]["share"] and second[0]["share"]
    assert first[0]["device"] == second[0]["device"]
    # 1.35: no device offers shares, so a share waits rather than being overbooked ...
    old = explain(capsys, tmp_path, *args, "--kubernetes-version", "1.35", claims=shares)
    assert set(newest["classes"]["gpu-shared.nvidia.com"].values()) == {True, False}
    assert set(old["classes"]["gpu-shared.nvidia.com"].values()) == {False}
    dropped = (
        "capacity.requests dropped by a Kubernetes 1.35 API server (DRAConsumableCapacity off)"
    )
    for entry in old["claims"]:
        assert entry["failure"] != ""
        assert any(dropped in note for note in entry["notes"]), entry["notes"]
    # ... and a capacity request of the plain class takes a whole GPU each
    whole = (share("w0", "gpu.nvidia.com"), share("w1", "gpu.nvidia.com"))
    classes = ["--class", str(CLASSES), *args[2:], "--kubernetes-version", "1.35"]
    old = explain(capsys, tmp_path, *classes, claims=whole)
    results = [r for c in old["claims"] for r in c["results"]]
    assert len({r["device"] for r in results}) == 2
    assert not any(r["share"] for r in results)


def test_an_unhealthy_gpu_is_not_published_on_1_35_so_a_toleration_cannot_take_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    sick = next(g for g in inventory(A100).gpus if not g.mig_enabled)
    tolerant = claim(
        "tolerant",
        deviceClassName="gpu.nvidia.com",
        selectors=[
            {"cel": {"expression": f"device.attributes['gpu.nvidia.com'].uuid == '{sick.uuid}'"}}
        ],
        tolerations=[{"operator": "Exists"}],
    )
    args = ["--class", str(CLASSES), "--simulate", A100, "--unhealthy", sick.uuid]
    newest = explain(capsys, tmp_path, *args, claims=(tolerant,))
    old = explain(capsys, tmp_path, *args, "--kubernetes-version", "1.35", claims=(tolerant,))
    assert newest["claims"][0]["failure"] == ""  # tolerated taint: the newest gives it
    assert sick.uuid in {d["uuid"] for d in newest["devices"]}
    assert sick.uuid not in {d["uuid"] for d in old["devices"]}
    assert old["claims"][0]["failure"] != ""
    assert any(
        "tolerations dropped by a Kubernetes 1.35 API server (DRADeviceTaints off)" in n
        for n in old["claims"][0]["notes"]
    )


@pytest.mark.parametrize("version", ["1.33", "1.38", "latest"])
def test_a_version_it_does_not_know_exits_2_naming_those_it_knows(
    capsys: pytest.CaptureFixture[str], version: str
) -> None:
    code = main(
        [
            "dra",
            "explain",
            "--class",
            str(CLASSES),
            "--simulate",
            A100,
            "--kubernetes-version",
            version,
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert f"--kubernetes-version: {version!r} is not one of 1.34, 1.35, 1.36, 1.37" in err


def test_a_distinct_attribute_constraint_is_dropped_on_1_35_and_named(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    spread = claim("spread", deviceClassName="gpu.nvidia.com", count=2)
    spread["spec"]["devices"]["constraints"] = [{"distinctAttribute": "gpu.nvidia.com/uuid"}]
    args = ["--class", str(CLASSES), "--simulate", A100]
    newest = explain(capsys, tmp_path, *args, claims=(spread,))
    old = explain(capsys, tmp_path, *args, "--kubernetes-version", "1.35", claims=(spread,))
    assert not any("distinctAttribute" in note for note in newest["claims"][0]["notes"])
    dropped = (
        "constraint: distinctAttribute gpu.nvidia.com/uuid dropped by a Kubernetes 1.35 API"
        " server (DRAConsumableCapacity off)"
    )
    assert dropped in old["claims"][0]["notes"], old["claims"][0]["notes"]
    assert old["claims"][0]["failure"] == ""
