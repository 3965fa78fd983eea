"""GPU node labels in GPU Feature Discovery's keys and formats: computed from the simulated
presets' inventories, then written by a running plugin onto its Node (a JSON merge patch of our
keys only) or, where NFD's CRD is served, into a NodeFeature; followed as the config changes;
never removed by a restart. The API server is the stand-in, over real HTTP, which checks every
label key and value as the API server does."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from dranode import inventory
from simnode import gpu, migs, write_node
from test_http import GPU, until
from test_node_config import CONFIG_LABEL, NODE, in_loop, running_node

import deviceplugin.runtime.nodeagent
from deviceplugin.demos.plugin import SEED_CONFIG
from deviceplugin.model.config import load_config_text
from deviceplugin.model.gpulabels import family, gpu_labels, owned, product_name
from deviceplugin.model.log import FIELDS
from deviceplugin.ops.metrics import Metrics
from deviceplugin.runtime.nodelabels import label_patch
from deviceplugin.sim.apiserver import ApiServer

DRIVER = {
    "nvidia.com/cuda.driver-version.major": "550",
    "nvidia.com/cuda.driver-version.minor": "90",
    "nvidia.com/cuda.driver-version.revision": "07",
    "nvidia.com/cuda.driver-version.full": "550.90.07",
}
A100_MIXED_SHARED = {
    **DRIVER,
    "nvidia.com/gpu.present": "true",
    "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB-SHARED",
    "nvidia.com/gpu.count": "8",
    "nvidia.com/gpu.replicas": "2",
    "nvidia.com/gpu.sharing-strategy": "time-slicing",
    "nvidia.com/gpu.memory": "81920",
    "nvidia.com/gpu.family": "ampere",
    "nvidia.com/gpu.compute.major": "8",
    "nvidia.com/gpu.compute.minor": "0",
    "nvidia.com/mig.capable": "true",
    "nvidia.com/mig.strategy": "mixed",
    "nvidia.com/mig-1g.10gb.product": "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb",
    "nvidia.com/mig-1g.10gb.count": "28",
    "nvidia.com/mig-1g.10gb.replicas": "1",
    "nvidia.com/mig-1g.10gb.sharing-strategy": "none",
    "nvidia.com/mig-1g.10gb.memory": "9728",
    "nvidia.com/mig-1g.10gb.slices.gi": "1",
    "nvidia.com/mig-1g.10gb.slices.ci": "1",
}


def labels(preset: str, config: str) -> dict[str, str]:
    return gpu_labels(inventory(preset), load_config_text(config, None, {}, {}).config)


def test_a_mixed_node_with_shared_gpus_reads_as_gfd_labels_it() -> None:
    assert labels("a100-80gb-x8-mixed", SEED_CONFIG.format(replicas=2)) == A100_MIXED_SHARED


def test_without_sharing_or_mig_strategy() -> None:
    found = labels("h100-x8", "version: v1")
    assert found["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert found["nvidia.com/gpu.replicas"] == "1"
    assert found["nvidia.com/gpu.sharing-strategy"] == "none"
    assert found["nvidia.com/gpu.family"] == "hopper"
    assert "nvidia.com/mig.strategy" not in found  # GFD sets it only with a MIG strategy
    assert not any(key.startswith("nvidia.com/mig-") for key in found)


def test_single_strategy_labels_the_mig_devices_as_the_gpu() -> None:
    found = labels("a30-x4-mig", "version: v1\nflags: {migStrategy: single}")
    assert found["nvidia.com/gpu.product"] == "NVIDIA-A30-MIG-1g.6gb"
    assert found["nvidia.com/gpu.count"] == "16"
    assert found["nvidia.com/gpu.memory"] == "5952"
    assert (found["nvidia.com/gpu.slices.gi"], found["nvidia.com/gpu.slices.ci"]) == ("1", "1")


def test_single_strategy_on_a_layout_it_cannot_serve_reads_invalid() -> None:
    found = labels("a100-80gb-x8-mixed", "version: v1\nflags: {migStrategy: single}")
    assert found["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB-MIG-INVALID"
    assert found["nvidia.com/gpu.count"] == "0"


def test_a_renamed_shared_resource_has_no_shared_suffix() -> None:
    config = (
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
        "      - name: nvidia.com/gpu\n        rename: gpu-shared\n        replicas: 4\n"
    )
    found = labels("h100-x8", config)
    assert found["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert found["nvidia.com/gpu.replicas"] == "4"


@pytest.mark.parametrize(
    ("parts", "expected"),
    [
        (("NVIDIA A100-SXM4-80GB",), "NVIDIA-A100-SXM4-80GB"),
        (("Tesla  V100 (PCIe)", "SHARED"), "Tesla-V100-PCIe-SHARED"),
        (("NVIDIA A30", "MIG", "1g.6gb+me"), "NVIDIA-A30-MIG-1g.6gbme"),
    ],
)
def test_product_names_are_sanitised_as_gfd_does(parts: tuple[str, ...], expected: str) -> None:
    assert product_name(*parts) == expected


@pytest.mark.parametrize(
    ("major", "minor", "expected"),
    [
        (7, 0, "volta"),
        (7, 5, "turing"),
        (8, 6, "ampere"),
        (8, 9, "ada-lovelace"),
        (4, 0, "undefined"),
    ],
)
def test_families(major: int, minor: int, expected: str) -> None:
    assert family(major, minor) == expected


def test_a_patch_touches_only_our_keys() -> None:
    current = {
        "kubernetes.io/hostname": "n",
        "nvidia.com/gpu.product": "old",
        "nvidia.com/mig-2g.20gb.count": "3",  # ours, gone after a re-cut
        "nvidia.com/gpu.deploy.operands": "true",  # the GPU operator's, not ours
        "nvidia.com/device-plugin.config": "a",
    }
    patch = label_patch({"nvidia.com/gpu.product": "new"}, current)
    assert patch == {"nvidia.com/gpu.product": "new", "nvidia.com/mig-2g.20gb.count": None}
    assert not owned("nvidia.com/device-plugin.config")
    assert owned("nvidia.com/mig-1g.10gb.slices.gi")


# --- a running plugin writes them -----------------------------------------------------------


@in_loop
async def test_the_node_carries_the_labels_and_they_follow_the_config() -> None:
    foreign = {"team": "ml", "nvidia.com/gpu.deploy.operands": "true"}
    stale = {"nvidia.com/mig-3g.40gb.count": "2"}
    labels = {CONFIG_LABEL: "shared", **foreign, **stale}
    async with running_node(labels, gpu_labels=True) as node:

        def on_node() -> dict[str, str]:
            found: dict[str, str] = node.api.nodes[NODE]["metadata"]["labels"]
            return found

        await until(lambda: on_node().get("nvidia.com/gpu.replicas") == "2")
        assert on_node() == {CONFIG_LABEL: "shared", **foreign, **A100_MIXED_SHARED}
        node.label("dedicated")
        await until(lambda: on_node().get("nvidia.com/gpu.replicas") == "1")
        assert on_node()["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
        assert on_node()["nvidia.com/gpu.sharing-strategy"] == "none"
        await until(lambda: node.kubelet.allocatable(GPU) == 4)  # its stream, not the labels
        patches = [p for m, p in node.api.requests if m == "PATCH"]
        assert patches == [f"/api/v1/nodes/{NODE}"] * 2  # nothing written when nothing changed

    # a restart removes nothing
    assert on_node()["nvidia.com/gpu.present"] == "true"


@in_loop
async def test_with_nfd_the_labels_go_into_a_node_feature() -> None:
    api = ApiServer(nfd=True)
    async with running_node({CONFIG_LABEL: "shared"}, api=api, gpu_labels=True) as node:
        key = ("gpu-system", f"{NODE}-deviceplugin")
        await until(lambda: key in api.node_features)
        feature = api.node_features[key]
        assert feature["spec"]["labels"] == A100_MIXED_SHARED
        assert feature["metadata"]["labels"] == {"nfd.node.kubernetes.io/node-name": NODE}
        node.label("dedicated")
        await until(
            lambda: api.node_features[key]["spec"]["labels"]["nvidia.com/gpu.replicas"] == "1"
        )
        assert not any(method == "PATCH" for method, _ in api.requests)
        status = (await node.status())["config"]["selection"]
        assert (status["gpu_labels"], status["gpu_labels_error"]) == ("NodeFeature", None)


@in_loop
async def test_labels_alone_need_no_config_dir() -> None:
    async with running_node({}, named=False, gpu_labels=True) as node:
        await until(lambda: "nvidia.com/gpu.product" in node.api.nodes[NODE]["metadata"]["labels"])
        assert node.supervisor.status().core.config_source is None  # the defaults


@in_loop
async def test_a_mig_recut_relabels_and_removes_the_profile_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(deviceplugin.runtime.nodeagent, "LABEL_CHECK_SECONDS", 0.1)
    node_file = write_node(tmp_path / "node.yaml", [gpu(0, **migs(0, "1g.10gb", "1g.10gb"))])
    async with running_node({}, simulate=str(node_file), gpu_labels=True) as node:

        def on_node() -> dict[str, str]:
            found: dict[str, str] = node.api.nodes[NODE]["metadata"]["labels"]
            return found

        await until(lambda: on_node().get("nvidia.com/mig-1g.10gb.count") == "2")
        write_node(node_file, [gpu(0, **migs(0, "3g.40gb"))])
        assert await node.supervisor.rediscover()  # what the periodic check does
        await until(lambda: on_node().get("nvidia.com/mig-3g.40gb.count") == "1")
        assert not [key for key in on_node() if key.startswith("nvidia.com/mig-1g.10gb")]


POLICY = (
    "ValidatingAdmissionPolicy 'deviceplugin-node-labels' with binding 'deviceplugin-node-labels'"
    " denied request: the plugin writes only its own GPU label keys"
)


@in_loop
async def test_a_refused_label_write_is_logged_once_counted_and_shown(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO, logger="deviceplugin")
    monkeypatch.setattr(deviceplugin.runtime.nodeagent, "LABEL_CHECK_SECONDS", 0.05)
    api = ApiServer()
    api.refuse_writes(POLICY)
    metrics = Metrics()

    def refused() -> float:
        sample = "deviceplugin_api_writes_refused_total"
        return metrics.registry.get_sample_value(sample, {"resource": "nodes"}) or 0.0

    async with running_node(
        {CONFIG_LABEL: "shared"}, api=api, gpu_labels=True, metrics=metrics
    ) as node:
        await until(lambda: refused() >= 3)
        status = (await node.status())["config"]["selection"]
        assert POLICY in status["gpu_labels_error"]
        assert node.supervisor.status().ready  # the kubelet is served all the same

        api.refuse_writes(None)
        await until(lambda: "nvidia.com/gpu.product" in api.nodes[NODE]["metadata"]["labels"])
        status = (await node.status())["config"]["selection"]
        assert status["gpu_labels_error"] is None

    logged = [r for r in caplog.records if r.getMessage() == "api.write.refused"]
    assert len(logged) == 1 and POLICY in getattr(logged[0], FIELDS)["error"]
