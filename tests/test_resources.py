"""MIG strategies, time-slicing and health applied to hand-built inventories."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from deviceplugin.model.config import Config, parse_config
from deviceplugin.model.devices import Gpu, Health, Inventory, MigDevice
from deviceplugin.model.errors import ConfigError, DiscoveryError
from deviceplugin.model.resources import apply_health, build_plan, socket_name


def mig(gpu: int, n: int, profile: str = "1g.10gb", g: int = 1, c: int = 1) -> MigDevice:
    return MigDevice(
        uuid=f"MIG-{gpu}-{n}",
        index=n,
        gpu_instance_id=n + 7,
        compute_instance_id=0,
        profile=profile,
        memory_mib=9728,
        gpu_slices=g,
        compute_slices=c,
    )


def gpu(
    index: int,
    migs: tuple[MigDevice, ...] | None = None,
    numa: int | None = 0,
    uuid: str | None = None,
) -> Gpu:
    return Gpu(
        index=index,
        uuid=uuid or f"GPU-{index}",
        name="NVIDIA A100-SXM4-80GB",
        memory_mib=81920,
        minor=index,
        pci_bus_id=f"00000000:{index:02x}:00.0",
        numa_node=numa,
        mig_capable=True,
        mig_enabled=migs is not None,
        mig_devices=migs or (),
    )


def node(*gpus: Gpu) -> Inventory:
    return Inventory(gpus=gpus)


def config(**raw: Any) -> Config:
    return _config(raw)


SEED = {
    "flags": {"migStrategy": "mixed"},
    "sharing": {"timeSlicing": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2}]}},
}
SEVEN = tuple(mig(0, n) for n in range(7))


def counts(inventory: Inventory, cfg: Config) -> dict[str, int]:
    return {name: len(rs.devices) for name, rs in build_plan(inventory, cfg).resources.items()}


@pytest.mark.parametrize(
    ("inventory", "raw", "expected"),
    [
        pytest.param(node(gpu(0), gpu(1)), {}, {"nvidia.com/gpu": 2}, id="none-whole-gpus"),
        pytest.param(
            node(gpu(0, SEVEN), gpu(1)), {}, {"nvidia.com/gpu": 2}, id="none-mig-gpu-counts-whole"
        ),
        pytest.param(
            node(gpu(0, SEVEN), gpu(1, tuple(mig(1, n) for n in range(7)))),
            {"flags": {"migStrategy": "single"}},
            {"nvidia.com/gpu": 14},
            id="single-all-mig",
        ),
        pytest.param(
            node(gpu(0), gpu(1)),
            {"flags": {"migStrategy": "single"}},
            {"nvidia.com/gpu": 2},
            id="single-without-mig-is-none",
        ),
        pytest.param(
            node(gpu(0, SEVEN), gpu(1, tuple(mig(1, n) for n in range(7))), gpu(2), gpu(3)),
            SEED,
            {"nvidia.com/gpu": 4, "nvidia.com/mig-1g.10gb": 14},
            id="seed-mixed-time-sliced",
        ),
        pytest.param(
            node(gpu(0, (mig(0, 0, "1g.10gb+me"), mig(0, 1, "3g.40gb", 3, 3))), gpu(1)),
            {"flags": {"migStrategy": "mixed"}},
            {"nvidia.com/gpu": 1, "nvidia.com/mig-1g.10gb.me": 1, "nvidia.com/mig-3g.40gb": 1},
            id="mixed-me-profile",
        ),
        pytest.param(
            node(gpu(0, (mig(0, 0, "1c.3g.40gb", 3, 1),)), gpu(1)),
            {"flags": {"migStrategy": "mixed"}},
            {"nvidia.com/gpu": 1},
            id="mixed-compute-subprofile-skipped",
        ),
        pytest.param(
            node(gpu(0, ()), gpu(1)),
            {"flags": {"migStrategy": "mixed"}},
            {"nvidia.com/gpu": 1},
            id="mixed-empty-mig-gpu-skipped",
        ),
    ],
)
def test_strategy_counts(
    inventory: Inventory, raw: dict[str, Any], expected: dict[str, int]
) -> None:
    assert counts(inventory, config(**raw)) == expected


def test_seed_ids_are_replicas_of_physical_gpus() -> None:
    plan = build_plan(node(gpu(0, SEVEN), gpu(1)), config(**SEED))
    gpus = plan.resources["nvidia.com/gpu"]
    assert [d.id for d in gpus.devices] == ["GPU-1::0", "GPU-1::1"]
    assert {d.physical_uuid for d in gpus.devices} == {"GPU-1"}
    assert gpus.replicas == 2 and gpus.shared
    migs = plan.resources["nvidia.com/mig-1g.10gb"]
    assert [d.id for d in migs.devices] == [f"MIG-0-{n}" for n in range(7)]
    assert not migs.shared


@pytest.mark.parametrize(
    ("inventory", "fragment"),
    [
        pytest.param(node(gpu(0, SEVEN), gpu(1)), "GPU 1 (GPU-1)", id="single-mixed-mig-modes"),
        pytest.param(
            node(gpu(0, SEVEN), gpu(1, (mig(1, 0, "3g.40gb", 3, 3),))),
            "3g.40gb",
            id="single-different-profiles",
        ),
    ],
)
def test_single_strategy_errors_name_the_gpus(inventory: Inventory, fragment: str) -> None:
    with pytest.raises(DiscoveryError, match="single") as caught:
        build_plan(inventory, config(flags={"migStrategy": "single"}))
    assert fragment in str(caught.value)


def test_single_refuses_a_mig_gpu_without_instances() -> None:
    with pytest.raises(DiscoveryError, match=r"GPU 1 \(GPU-1\) has MIG enabled but no MIG devices"):
        build_plan(node(gpu(0, SEVEN), gpu(1, ())), config(flags={"migStrategy": "single"}))


def sharing(*entries: dict[str, Any], **flags: Any) -> dict[str, Any]:
    return {"sharing": {"timeSlicing": {"resources": list(entries), **flags}}}


def test_rename_by_default_and_fail_requests_flag() -> None:
    raw = sharing(
        {"name": "nvidia.com/gpu", "replicas": 3},
        renameByDefault=True,
        failRequestsGreaterThanOne=True,
    )
    plan = build_plan(node(gpu(0), gpu(1)), config(**raw))
    assert list(plan.resources) == ["nvidia.com/gpu.shared"]
    shared = plan.resources["nvidia.com/gpu.shared"]
    assert len(shared.devices) == 6 and shared.fail_requests_greater_than_one


UUID3 = "GPU-b1028956-cfa2-0990-bf4a-5da9abb51763"


def test_dedicated_and_shared_side_by_side() -> None:
    raw = sharing(
        {
            "name": "nvidia.com/gpu",
            "rename": "nvidia.com/gpu.shared",
            "devices": ["1", UUID3],
            "replicas": 4,
        }
    )
    plan = build_plan(node(gpu(0), gpu(1), gpu(2), gpu(3, uuid=UUID3)), config(**raw))
    assert [d.id for d in plan.resources["nvidia.com/gpu"].devices] == ["GPU-0", "GPU-2"]
    shared = plan.resources["nvidia.com/gpu.shared"].devices
    assert {d.physical_uuid for d in shared} == {"GPU-1", UUID3} and len(shared) == 8


def test_a_device_count_shares_the_first_devices_by_index() -> None:
    raw = sharing(
        {"name": "nvidia.com/gpu", "rename": "nvidia.com/gpu.shared", "devices": 2, "replicas": 2}
    )
    plan = build_plan(node(gpu(2), gpu(0), gpu(3), gpu(1)), config(**raw))
    assert [d.id for d in plan.resources["nvidia.com/gpu"].devices] == ["GPU-2", "GPU-3"]
    shared = plan.resources["nvidia.com/gpu.shared"].devices
    assert [d.id for d in shared] == ["GPU-0::0", "GPU-0::1", "GPU-1::0", "GPU-1::1"]


def test_a_count_of_every_device_needs_no_rename() -> None:
    raw = sharing({"name": "nvidia.com/gpu", "devices": 2, "replicas": 3})
    plan = build_plan(node(gpu(0), gpu(1)), config(**raw))
    assert list(plan.resources) == ["nvidia.com/gpu"]
    assert len(plan.resources["nvidia.com/gpu"].devices) == 6


def test_a_count_above_the_devices_on_the_node_is_refused() -> None:
    raw = sharing({"name": "nvidia.com/gpu", "devices": 3, "replicas": 2})
    with pytest.raises(ConfigError) as caught:
        build_plan(node(gpu(0), gpu(1)), config(**raw))
    assert caught.value.path == "sharing.timeSlicing.resources[0].devices"
    assert "asks to share 3 devices, but this node has only 2 nvidia.com/gpu devices" in str(
        caught.value
    )


def test_a_legacy_mig_reference_selects_its_mig_device() -> None:
    legacy = f"MIG-{UUID3}/8/0"  # gpu_instance_id 8 is the second MIG device of mig()
    raw = {
        "flags": {"migStrategy": "mixed"},
        **sharing(
            {
                "name": "nvidia.com/mig-1g.10gb",
                "rename": "nvidia.com/mig-1g.10gb.shared",
                "devices": [legacy],
                "replicas": 2,
            }
        ),
    }
    migs = (mig(0, 0), mig(0, 1))
    plan = build_plan(node(gpu(0, migs, uuid=UUID3)), config(**raw))
    shared = plan.resources["nvidia.com/mig-1g.10gb.shared"].devices
    assert {d.physical_uuid for d in shared} == {"MIG-0-1"}
    assert [d.id for d in plan.resources["nvidia.com/mig-1g.10gb"].devices] == ["MIG-0-0"]


def test_time_slicing_a_mig_resource() -> None:
    raw = {
        "flags": {"migStrategy": "mixed"},
        **sharing({"name": "nvidia.com/mig-1g.10gb", "replicas": 2}),
    }
    plan = build_plan(node(gpu(0, SEVEN[:2]), gpu(1)), config(**raw))
    ids = [d.id for d in plan.resources["nvidia.com/mig-1g.10gb"].devices]
    assert ids == ["MIG-0-0::0", "MIG-0-0::1", "MIG-0-1::0", "MIG-0-1::1"]


@pytest.mark.parametrize(
    ("raw", "path"),
    [
        pytest.param(
            sharing({"name": "nvidia.com/gpu", "devices": ["0"], "replicas": 2}),
            "sharing.timeSlicing.resources[0].devices",
            id="subset-without-rename",
        ),
        pytest.param(
            sharing(
                {"name": "nvidia.com/gpu", "rename": "nvidia.com/mig-1g.10gb", "replicas": 2},
            )
            | {"flags": {"migStrategy": "mixed"}},
            "sharing.timeSlicing.resources[0].rename",
            id="rename-onto-existing",
        ),
    ],
)
def test_sharing_that_contradicts_the_node(raw: dict[str, Any], path: str) -> None:
    with pytest.raises(ConfigError) as caught:
        build_plan(node(gpu(0, SEVEN[:1]), gpu(1), gpu(2)), config(**raw))
    assert caught.value.path == path


@pytest.mark.parametrize(
    ("resources", "path", "fragment"),
    [
        pytest.param(
            {"gpus": [{"pattern": "*", "name": "mig-1g.10gb"}]},
            "resources.gpus[0].name",
            "renames whole GPUs to nvidia.com/mig-1g.10gb, the name the node's 1g.10gb MIG "
            "devices already have",
            id="gpus-onto-a-mig-profile",
        ),
        pytest.param(
            {"mig": [{"pattern": "1g.10gb", "name": "gpu"}]},
            "resources.mig[0].name",
            "renames 1g.10gb MIG devices to nvidia.com/gpu, the name the node's whole GPUs",
            id="mig-onto-whole-gpus",
        ),
        pytest.param(
            {"mig": [{"pattern": "1g.10gb", "name": "mig-2g.20gb"}]},
            "resources.mig[0].name",
            "renames 1g.10gb MIG devices to nvidia.com/mig-2g.20gb, the name the node's 2g.20gb",
            id="mig-onto-another-profile",
        ),
        pytest.param(
            {
                "gpus": [{"pattern": "*", "name": "any"}],
                "mig": [{"pattern": "*", "name": "any"}],
            },
            "resources.gpus[0].name",
            "renames whole GPUs to nvidia.com/any, the name the node's 1g.10gb MIG devices",
            id="both-renamed-onto-one-name",
        ),
    ],
)
def test_a_rename_onto_a_name_other_devices_have_is_refused(
    resources: dict[str, Any], path: str, fragment: str
) -> None:
    inventory = node(gpu(0, (mig(0, 0), mig(0, 1, "2g.20gb", g=2, c=2))), gpu(1))
    raw = {"flags": {"migStrategy": "mixed"}, "resources": resources}
    with pytest.raises(ConfigError) as caught:
        build_plan(inventory, config(**raw))
    assert caught.value.path == path
    assert fragment in caught.value.message


def test_renames_within_one_family_may_share_a_name() -> None:
    inventory = node(gpu(0, (mig(0, 0), mig(0, 1, "2g.20gb", g=2, c=2))), gpu(1))
    raw = {
        "flags": {"migStrategy": "mixed"},
        "resources": {"mig": [{"pattern": "*", "name": "mig-any"}]},
    }
    assert counts(inventory, config(**raw)) == {"nvidia.com/gpu": 1, "nvidia.com/mig-any": 2}


def test_sharing_an_absent_resource_warns() -> None:
    raw = sharing({"name": "nvidia.com/mig-3g.40gb", "replicas": 2})
    plan = build_plan(node(gpu(0)), config(**raw))
    assert list(plan.resources) == ["nvidia.com/gpu"]
    assert any("nvidia.com/mig-3g.40gb" in w for w in plan.warnings)


def test_health_fans_out_from_gpu_and_stays_on_one_mig() -> None:
    raw = {"flags": {"migStrategy": "mixed"}, **sharing({"name": "nvidia.com/gpu", "replicas": 2})}
    plan = build_plan(node(gpu(0, SEVEN[:3]), gpu(1), gpu(2)), config(**raw)).resources
    marked = apply_health(plan, {"GPU-1": "xid-79", "MIG-0-1": "xid-94", "GPU-0": "gpu-lost"})
    gpus = {d.id: (d.health, d.reason) for d in marked["nvidia.com/gpu"].devices}
    assert gpus == {
        "GPU-1::0": (Health.UNHEALTHY, "xid-79"),
        "GPU-1::1": (Health.UNHEALTHY, "xid-79"),
        "GPU-2::0": (Health.HEALTHY, ""),
        "GPU-2::1": (Health.HEALTHY, ""),
    }
    migs = {d.id: d.reason for d in marked["nvidia.com/mig-1g.10gb"].devices}
    assert migs == {"MIG-0-0": "gpu-lost", "MIG-0-1": "xid-94", "MIG-0-2": "gpu-lost"}
    only_mig = apply_health(plan, {"MIG-0-1": "xid-94"})["nvidia.com/mig-1g.10gb"].devices
    assert [d.healthy for d in only_mig] == [True, False, True]
    assert apply_health(marked, {}) == plan


@pytest.mark.parametrize(
    ("resource", "socket"),
    [
        pytest.param("nvidia.com/gpu", "nvidia-gpu.sock", id="gpu"),
        pytest.param("nvidia.com/mig-1g.10gb", "nvidia-mig-1g.10gb.sock", id="mig"),
        pytest.param("nvidia.com/gpu.shared", "nvidia-gpu.shared.sock", id="shared"),
    ],
)
def test_socket_names(resource: str, socket: str) -> None:
    assert socket_name(resource) == socket


def test_two_resources_on_one_socket_are_refused() -> None:
    raw = sharing(
        {"name": "nvidia.com/gpu", "rename": "nvidia.io/gpu", "devices": ["0"], "replicas": 2}
    )
    with pytest.raises(ConfigError, match=r"nvidia-gpu\.sock") as caught:
        build_plan(node(gpu(0), gpu(1)), config(**raw))
    assert caught.value.path == "sharing.timeSlicing.resources[0].rename"


def _config(document: dict[str, Any]) -> Config:
    """A config as a file holding `document` gives it."""
    return parse_config(json.dumps(document)).config


# --- MPS ------------------------------------------------------------------------------------------


def mps(strategy: str = "none", replicas: int = 4, **sharing: Any) -> Config:
    resources = [{"name": "nvidia.com/gpu", "replicas": replicas}]
    return config(
        flags={"migStrategy": strategy, "mpsRoot": "/run/nvidia/mps"},
        sharing={"mps": {"resources": resources, **sharing}},
    )


def test_mps_replicas_are_named_as_time_slicing_and_marked_mps() -> None:
    plan = build_plan(node(gpu(0), gpu(1)), mps(renameByDefault=True))
    [shared] = plan.resources.values()
    assert shared.name == "nvidia.com/gpu.shared" and shared.mps
    assert [d.id for d in shared.devices][:2] == ["GPU-0::0", "GPU-0::1"]
    assert len(shared.devices) == 8 and shared.fail_requests_greater_than_one


def test_mps_on_mig_devices_is_refused() -> None:
    with pytest.raises(ConfigError) as caught:
        build_plan(node(gpu(0, (mig(0, 0),))), mps("single"))
    assert caught.value.path == "sharing.mps.resources[0].name"
    assert "sharing using MPS is not supported for MIG devices" in caught.value.message


@pytest.mark.parametrize(
    ("capability", "replicas", "refused"),
    [
        pytest.param("8.0", 48, False, id="ampere-48"),
        pytest.param("8.0", 49, True, id="ampere-49"),
        pytest.param("7.0", 16, False, id="volta-70-16"),
        pytest.param("7.0", 17, True, id="volta-70-17"),
    ],
)
def test_mps_replicas_are_bounded_by_the_servers_clients(
    capability: str, replicas: int, refused: bool
) -> None:
    inventory = node(replace(gpu(0), compute_capability=capability))
    if not refused:
        assert (
            len(build_plan(inventory, mps(replicas=replicas)).resources["nvidia.com/gpu"].devices)
            == replicas
        )
        return
    with pytest.raises(ConfigError) as caught:
        build_plan(inventory, mps(replicas=replicas))
    assert caught.value.path == "sharing.mps.resources[0].replicas"
    assert "maximum allowed replicas exceeded" in caught.value.message
