"""`model.owners`: what the other allocator of a node handed out, mapped to its GPUs and MIG
devices. Device-plugin IDs in every form NVIDIA's plugins and ours write, prepared claims'
devices as this project's DRA driver and NVIDIA's name them, and what cannot be mapped exactly:
it withholds every GPU it could belong to and says why."""

from __future__ import annotations

from deviceplugin.model.assignments import ClaimDevice, PodDevice
from deviceplugin.model.devices import Gpu, Inventory, MigDevice
from deviceplugin.model.owners import Held, Holdings, held_by_claims, held_by_device_plugins
from deviceplugin.model.slices import device_name

POD = "ml/trainer"
DRIVER = "gpu.nvidia.com"


def _mig(gpu: int, index: int, gi: int, ci: int = 0) -> MigDevice:
    return MigDevice(
        uuid=f"MIG-{gpu}-{index}",
        index=index,
        gpu_instance_id=gi,
        compute_instance_id=ci,
        profile="1g.10gb",
        memory_mib=9728,
        gpu_slices=1,
        compute_slices=1,
    )


def _gpu(index: int, migs: tuple[MigDevice, ...] = ()) -> Gpu:
    """GPU `index` at /dev/nvidia<index + 1>: index IDs and DRA names cannot be confused."""
    return Gpu(
        index=index,
        uuid=f"GPU-{index}",
        name="NVIDIA A100-SXM4-80GB",
        memory_mib=81920,
        minor=index + 1,
        pci_bus_id=f"00000000:0{index}:00.0",
        numa_node=0,
        mig_capable=True,
        mig_enabled=bool(migs),
        mig_devices=migs,
    )


# GPUs 0 and 3 in MIG mode (two MIG devices each), GPUs 1, 2 and 4 whole.
NODE = Inventory(
    gpus=(
        _gpu(0, (_mig(0, 0, gi=7), _mig(0, 1, gi=8))),
        _gpu(1),
        _gpu(2),
        _gpu(3, (_mig(3, 0, gi=9), _mig(3, 1, gi=10, ci=1))),
        _gpu(4),
    )
)
EVERY_GPU = {gpu.uuid for gpu in NODE.gpus}


def plugin_holds(device_id: str, resource: str = "nvidia.com/gpu") -> list[Held]:
    return list(
        held_by_device_plugins(NODE, [PodDevice("ml", "trainer", "main", resource, device_id)]).held
    )


def claim_holds(device: str, driver: str = DRIVER) -> list[Held]:
    entry = ClaimDevice("ml", "trainer", "main", "ml/gpus", driver, "node-a", device)
    return list(held_by_claims(NODE, [entry], [DRIVER]).held)


def _where(held: list[Held]) -> set[tuple[str, str | None]]:
    return {(entry.gpu, entry.mig) for entry in held}


# --- device-plugin IDs ------------------------------------------------------------------------


def test_a_gpu_uuid_holds_that_gpu() -> None:
    assert plugin_holds("GPU-2") == [Held("GPU-2", None, POD, "nvidia.com/gpu GPU-2")]


def test_a_replica_holds_its_gpu() -> None:
    (held,) = plugin_holds("GPU-4::3", "nvidia.com/gpu.shared")
    assert (held.gpu, held.mig, held.unmapped) == ("GPU-4", None, "")
    assert held.source == "nvidia.com/gpu.shared GPU-4::3"


def test_a_mig_uuid_holds_that_mig_device_of_its_parent() -> None:
    assert _where(plugin_holds("MIG-3-1", "nvidia.com/mig-1g.10gb")) == {("GPU-3", "MIG-3-1")}
    assert _where(plugin_holds("MIG-0-0::1", "nvidia.com/mig-1g.10gb")) == {("GPU-0", "MIG-0-0")}


def test_index_ids_name_gpus_and_mig_devices_by_index_not_minor() -> None:
    assert _where(plugin_holds("3")) == {("GPU-3", None)}
    assert _where(plugin_holds("3:1", "nvidia.com/mig-1g.10gb")) == {("GPU-3", "MIG-3-1")}
    assert _where(plugin_holds("1::0")) == {("GPU-1", None)}


def test_an_unknown_mig_index_holds_the_whole_gpu_and_says_so() -> None:
    (held,) = plugin_holds("3:5", "nvidia.com/mig-1g.10gb")
    assert (held.gpu, held.mig) == ("GPU-3", None)
    assert held.unmapped == "GPU 3 has no MIG device 5"
    assert held.describe()["unmapped"] == held.unmapped


def test_an_index_this_node_does_not_have_holds_nothing() -> None:
    assert plugin_holds("9") == []


def test_an_unknown_mig_uuid_holds_every_gpu_in_mig_mode() -> None:
    held = plugin_holds("MIG-gone", "nvidia.com/mig-1g.10gb")
    assert _where(held) == {("GPU-0", None), ("GPU-3", None)}
    assert all(entry.unmapped == "a MIG UUID this node does not list" for entry in held)


def test_an_id_of_no_known_form_under_nvidia_holds_every_gpu() -> None:
    held = plugin_holds("card-7")
    assert _where(held) == {(uuid, None) for uuid in EVERY_GPU}
    assert all(entry.unmapped == "not a GPU UUID, MIG UUID or index ID" for entry in held)


def test_another_vendors_resource_is_ignored() -> None:
    assert plugin_holds("card-7", "example.com/fpga") == []
    assert plugin_holds("3", "example.com/fpga") == []


def test_a_gpu_uuid_this_node_does_not_have_holds_nothing() -> None:
    assert plugin_holds("GPU-elsewhere") == []
    assert plugin_holds("GPU-elsewhere::1") == []


# --- prepared claims' devices -----------------------------------------------------------------


def test_a_claimed_gpu_is_named_by_its_minor() -> None:
    (held,) = claim_holds("gpu-4")  # /dev/nvidia4 is GPU index 3
    assert (held.gpu, held.mig, held.holder) == ("GPU-3", None, POD)
    assert held.source == "claim ml/gpus: gpu.nvidia.com/gpu-4"


def test_a_claimed_mig_device_in_our_static_naming_holds_that_mig_device() -> None:
    gpu = NODE.gpus[3]
    for mig in gpu.mig_devices:
        name = device_name(gpu, mig)  # as our driver publishes it: gpu-4-mig-<gi>-<ci>
        assert _where(claim_holds(name)) == {("GPU-3", mig.uuid)}
    assert _where(claim_holds("gpu-4-mig-10-1")) == {("GPU-3", "MIG-3-1")}


def test_a_partition_or_unknown_mig_name_holds_its_whole_gpu() -> None:
    for name in ("gpu-1-mig-1g10gb-19-0", "gpu-1-mig-12-0", "gpu-1-mig-7-1"):
        (held,) = claim_holds(name)
        assert (held.gpu, held.mig) == ("GPU-0", None)
        assert held.unmapped == "a MIG device or partition not mapped exactly"


def test_devices_that_are_no_gpu_of_this_node_are_ignored() -> None:
    assert claim_holds("channel-0") == []  # a compute domain's channel
    assert claim_holds("gpu-9") == []  # no /dev/nvidia9 here
    assert claim_holds("gpu-4", driver="compute-domain.nvidia.com") == []
    assert claim_holds("gpu-4", driver="example.com") == []


# --- Holdings ---------------------------------------------------------------------------------


def test_a_held_gpu_blocks_the_gpu_and_each_of_its_mig_devices() -> None:
    holdings = Holdings(claim_holds("gpu-1"))
    assert holdings.blocking("GPU-0", None)
    assert holdings.blocking("GPU-0", "MIG-0-0") and holdings.blocking("GPU-0", "MIG-0-1")
    assert not holdings.blocking("GPU-1", None)
    assert holdings.gpus() == {"GPU-0"}


def test_a_held_mig_device_blocks_itself_and_its_parent_gpu_only() -> None:
    holdings = Holdings(claim_holds("gpu-1-mig-7-0"))
    assert holdings.blocking("GPU-0", "MIG-0-0")
    assert holdings.blocking("GPU-0", None)
    assert not holdings.blocking("GPU-0", "MIG-0-1")


def test_holdings_compare_by_what_is_held_and_drop_repeats() -> None:
    twice = [
        ClaimDevice("ml", "trainer", container, "ml/gpus", DRIVER, "node-a", "gpu-2")
        for container in ("main", "sidecar")
    ]
    holdings = held_by_claims(NODE, twice, [DRIVER])
    assert len(holdings.held) == 1  # one pod holds it, whichever containers use it
    assert holdings == Holdings(claim_holds("gpu-2"))
    assert not Holdings() and holdings
