"""One owner per GPU: what the other allocator of the node handed out, mapped to the hardware.

A node that moves between a device plugin and DRA with its pods running has two allocators for
one set of GPUs. The kubelet reports both through PodResources: device-plugin IDs per container
(`devices`) and prepared claims' devices (`dynamic_resources`). Each daemon maps the other's
entries to GPUs and MIG devices of its inventory (`Held`), and offers none of what they hold:

- a held whole GPU withholds that GPU and every MIG device or partition of it;
- a held MIG device withholds that MIG device and its parent's whole-GPU device.

Device-plugin IDs are those of any NVIDIA plugin, ours and NVIDIA's: a GPU or MIG UUID, either
with a `::<n>` replica suffix, or an index ID (`<gpu>`, `<gpu>:<mig>`). DRA devices are named as
this project's driver and NVIDIA's name them: `gpu-<minor>`, and MIG devices or partitions of
it `gpu-<minor>-mig-...`. An entry that cannot be mapped withholds every GPU it could belong to
and says so (`Held.unmapped`): a GPU offered twice is worse than a GPU offered late.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Iterator

from deviceplugin.model.assignments import ClaimDevice, PodDevice
from deviceplugin.model.devices import Gpu, Inventory, strip_replica
from deviceplugin.model.record import record

NVIDIA_DOMAIN = "nvidia.com"

_INDEX_ID = re.compile(r"(\d+)(?::(\d+))?")
_DRA_DEVICE = re.compile(r"gpu-(\d+)(-mig-(.+))?")
_OUR_MIG_SUFFIX = re.compile(r"(\d+)-(\d+)")  # `<gpu instance>-<compute instance>`


@record(frozen=True)
class Held:
    """One GPU (`mig` None) or MIG device of it that the other allocator handed to a pod."""

    gpu: str  # the GPU's UUID
    mig: str | None  # the MIG device's UUID; None: the whole GPU
    holder: str  # `<namespace>/<pod>`
    source: str  # what handed it out, as the kubelet names it
    unmapped: str = ""  # why the entry could not be mapped exactly (then the whole GPU is held)

    def describe(self) -> dict[str, str]:
        described = {"gpu": self.gpu, "holder": self.holder, "source": self.source}
        if self.mig is not None:
            described["mig"] = self.mig
        if self.unmapped:
            described["unmapped"] = self.unmapped
        return described


class Holdings:
    """Everything held, looked up by device: which entries keep a device from being offered."""

    def __init__(self, held: Iterable[Held] = ()) -> None:
        self.held = tuple(sorted(set(held), key=lambda h: (h.gpu, h.mig or "", h.holder)))
        self._by_gpu: dict[str, list[Held]] = {}
        for entry in self.held:
            self._by_gpu.setdefault(entry.gpu, []).append(entry)

    def __bool__(self) -> bool:
        return bool(self.held)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Holdings) and self.held == other.held

    __hash__ = None  # type: ignore[assignment]

    def blocking(self, gpu: str, mig: str | None) -> tuple[Held, ...]:
        """The entries that withhold the whole GPU `gpu` (`mig` None: any entry on it) or its
        MIG device `mig` (the GPU held whole, or that MIG device held)."""
        on_gpu = self._by_gpu.get(gpu, ())
        if mig is None:
            return tuple(on_gpu)
        return tuple(entry for entry in on_gpu if entry.mig is None or entry.mig == mig)

    def gpus(self) -> frozenset[str]:
        """The GPUs with anything held on them."""
        return frozenset(self._by_gpu)


def held_by_device_plugins(inventory: Inventory, devices: Iterable[PodDevice]) -> Holdings:
    """What device plugins handed out on this node, from PodResources' `devices`."""
    return Holdings(
        held
        for entry in devices
        for held in plugin_device_holds(
            inventory, f"{entry.namespace}/{entry.pod}", entry.resource, entry.device_id
        )
    )


def held_by_claims(
    inventory: Inventory, claims: Iterable[ClaimDevice], drivers: Collection[str]
) -> Holdings:
    """What prepared claims of the GPU `drivers` (ours and NVIDIA's: `gpu.nvidia.com`) hold on
    this node, from PodResources' `dynamic_resources`."""
    return Holdings(
        held
        for entry in claims
        if entry.driver in drivers
        for held in claim_device_holds(
            inventory, f"{entry.namespace}/{entry.pod}", entry.claim, entry.driver, entry.device
        )
    )


def plugin_device_holds(
    inventory: Inventory, holder: str, resource: str, device_id: str
) -> list[Held]:
    """What one device-plugin ID the kubelet reports for `holder` holds on this node: nothing
    when it names no device of an NVIDIA plugin here."""
    source = f"{resource} {device_id}"
    nvidia = resource.split("/", 1)[0] == NVIDIA_DOMAIN
    physical = strip_replica(device_id)
    for gpu in inventory.gpus:
        if physical == gpu.uuid:
            return [Held(gpu.uuid, None, holder, source)]
        for mig in gpu.mig_devices:
            if physical == mig.uuid:
                return [Held(gpu.uuid, mig.uuid, holder, source)]
    if not nvidia:  # another vendor's ID that is not ours: no business of this node's GPUs
        return []
    if physical.startswith("GPU-"):
        return []  # a GPU this node does not have (any more): nothing here to withhold
    index = _INDEX_ID.fullmatch(physical)
    if index is not None:
        indexed = _by(inventory.gpus, index=int(index.group(1)))
        if indexed is None:
            return []
        if index.group(2) is None:
            return [Held(indexed.uuid, None, holder, source)]
        migs = [m for m in indexed.mig_devices if m.index == int(index.group(2))]
        if migs:
            return [Held(indexed.uuid, migs[0].uuid, holder, source)]
        why = f"GPU {indexed.index} has no MIG device {index.group(2)}"
        return [Held(indexed.uuid, None, holder, source, why)]
    if physical.startswith("MIG-"):
        # MIG devices are re-cut under new UUIDs: any GPU with MIG on could hold it.
        candidates = [gpu for gpu in inventory.gpus if gpu.mig_enabled] or list(inventory.gpus)
        why = "a MIG UUID this node does not list"
    else:
        candidates, why = list(inventory.gpus), "not a GPU UUID, MIG UUID or index ID"
    return [Held(gpu.uuid, None, holder, source, why) for gpu in candidates]


def claim_device_holds(
    inventory: Inventory, holder: str, claim: str, driver: str, device: str
) -> list[Held]:
    """What one device of a prepared claim (`driver`/`device`, as PodResources reports it)
    holds on this node; nothing for a device of another kind (a compute domain's channel)."""
    source = f"claim {claim}: {driver}/{device}"
    match = _DRA_DEVICE.fullmatch(device)
    if match is None:
        return []
    gpu = _by(inventory.gpus, minor=int(match.group(1)))
    if gpu is None:
        return []
    if match.group(2) is None:
        return [Held(gpu.uuid, None, holder, source)]
    ours = _OUR_MIG_SUFFIX.fullmatch(match.group(3))
    if ours is not None:
        for mig in gpu.mig_devices:
            ids = (mig.gpu_instance_id, mig.compute_instance_id)
            if ids == (int(ours.group(1)), int(ours.group(2))):
                return [Held(gpu.uuid, mig.uuid, holder, source)]
    # A partition, or a MIG device named another way: the GPU it lives on is held whole.
    return [Held(gpu.uuid, None, holder, source, "a MIG device or partition not mapped exactly")]


def _by(gpus: Iterable[Gpu], **wanted: int) -> Gpu | None:
    found: Iterator[Gpu] = (g for g in gpus if all(getattr(g, k) == v for k, v in wanted.items()))
    return next(found, None)
