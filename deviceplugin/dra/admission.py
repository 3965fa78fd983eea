"""Admission: what one claim's allocation may take of the node, checked against every claim
prepared so far (and those planned before it in the same call) before anything is written.

The scheduler keeps these rules while it is the only writer of allocations; the node does not
depend on it, since anyone who may write a claim's status can hand it any allocation. Each
refusal names the claim, the result's field and the device, and the other claim when there is
one:

- a memory share is at most the device's memory, and the shares prepared on a device sum to at
  most its memory, a share the checkpoint holds no size for counting as all of it
  (`OVERCOMMIT`);
- a share ID names one share of one device: it never appears for two devices, and a claim holds
  a device (or a share of it) once, since its containers get one cap per GPU (`OVERLAP`);
- a device is prepared for another claim only when both may share it (admin access, or each
  its own memory share: a share ID without one permits nothing), with MPS on it or not
  (`OVERLAP`, `MIXED_SHARING`);
- a GPU goes whole (or in shares) or as MIG devices, never both, in one claim or across claims:
  a whole GPU never alongside a static MIG device or a dynamic partition of it (`OVERLAP`);
- the dynamic partitions of one GPU never overlap, in one claim or across claims (`OVERLAP`).

Admin access is a monitor: it neither holds a device against others nor counts in their shares.
A result has it only when the claim's spec asked for it (`admin_requests`), which the API server
admits only in a namespace an administrator labelled; whoever writes the status could set it on
any result.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from deviceplugin.dra.checkpoint import UNSIZED, PreparedClaim, PreparedDevice
from deviceplugin.dra.mpsclient import MIB, mixing_problem
from deviceplugin.model.memoryshares import MEMORY
from deviceplugin.model.record import record

RESULTS_PATH = "status.allocation.devices.results"

# Why a claim could not be prepared: the `reason` label of the failure metric.
OVERLAP = "overlap"  # the device, or part of its GPU, is prepared for another claim
MIXED_SHARING = "mixed-sharing"  # MPS and not on one device
OVERCOMMIT = "overcommit"  # memory shares past the device's memory


@record(frozen=True)
class Asked:
    """One allocation result of the claim being admitted."""

    index: int  # in status.allocation.devices.results
    device: PreparedDevice
    origin: str  # the config entry that set its sharing ("" for none)
    capacity: int  # the device's memory in bytes

    @property
    def field(self) -> str:
        return f"{RESULTS_PATH}[{self.index}]"


@record(frozen=True)
class _Held:
    """A device another claim holds (or a result of this claim before the one checked)."""

    who: str  # "ResourceClaim ns/name", or "results[i] of this claim"
    device: PreparedDevice


def refusal(
    claim: str, asked: Sequence[Asked], others: Mapping[str, PreparedClaim]
) -> tuple[str, str] | None:
    """Why `claim` ("ns/name") cannot be prepared, as (message naming the field, reason): its
    results checked against each other and against `others`, the claims prepared (or planned)
    so far by UID, its own entry left out; None when every result keeps the rules."""
    held = [
        _Held(f"ResourceClaim {c.namespace}/{c.name}", d)
        for c in others.values()
        for d in c.devices
    ]
    for n, one in enumerate(asked):
        own = [_Held(f"{a.field} of this claim", a.device) for a in asked[:n]]
        for problem, reason in _problems(one, held, own):
            return f"ResourceClaim {claim}: {problem}", reason
    return None


def _problems(one: Asked, held: Sequence[_Held], own: Sequence[_Held]) -> Iterator[tuple[str, str]]:
    """Why `one` cannot be prepared, as (field and why, reason); nothing when it can."""
    device, at = one.device, one.field
    if device.memory > one.capacity:
        yield (
            f"{at}.consumedCapacity.{MEMORY}: a share of {_bytes(device.memory)} is more than the"
            f" memory of {device.device} ({_bytes(one.capacity)})",
            OVERCOMMIT,
        )
    if device.admin_access:
        return
    for other in own:
        if other.device.device == device.device and not other.device.admin_access:
            yield (
                f"{at}: {device.device} is also {other.who};"
                " a claim holds a device, or a share of it, once (its containers get one cap"
                " per GPU: ask one share of the sum)",
                OVERLAP,
            )
    everyone = [*held, *own]
    if device.share_id:
        for other in everyone:
            if other.device.share_id == device.share_id and other.device.device != device.device:
                yield (
                    f"{at}.shareID: {device.share_id} is also the share ID of {other.device.device}"
                    f" for {other.who}; a share ID names one share of one device",
                    OVERLAP,
                )
    for other in held:
        yield from _neighbour(one, other)
    for other in everyone:
        yield from _same_gpu(one, other)
    if device.memory:
        yield from _sum(one, held)


def _neighbour(one: Asked, other: _Held) -> Iterator[tuple[str, str]]:
    """The same device prepared for another claim: only when both may share it, with MPS on it
    or not. (Memory shares are never time-sliced, `shares.py`, so no two claims on a device can
    ask two time slices.)"""
    device, held = one.device, other.device
    if held.device != device.device or held.admin_access:
        return
    if not (_is_share(held) and _is_share(device) and held.share_id != device.share_id):
        yield (
            f"{one.field}: {device.device} is already prepared for {other.who}; claims share a"
            " device only with admin access or each with its own memory share",
            OVERLAP,
        )
    if mixed := mixing_problem(held.sharing, device.sharing, one.origin):
        yield f"{mixed} ({other.who})", MIXED_SHARING


def _same_gpu(one: Asked, other: _Held) -> Iterator[tuple[str, str]]:
    """Another device of the same GPU: never the GPU whole beside a MIG device of it, and
    never an overlapping partition."""
    device, held = one.device, other.device
    if held.admin_access or held.device == device.device or gpu_of(held) != gpu_of(device):
        return
    if _is_whole(held) != _is_whole(device):
        yield (
            f"{one.field}: {device.device} is of GPU {gpu_of(device)}, which {other.who} holds"
            f" as {held.device}: a GPU is handed out whole (or in shares) or as MIG devices,"
            " never both",
            OVERLAP,
        )
    mine, theirs = device.partition, held.partition
    if (
        mine is not None
        and theirs is not None
        and mine.gpu == theirs.gpu
        and mine.start < theirs.start + theirs.size
        and theirs.start < mine.start + mine.size
    ):
        yield (
            f"{one.field}: partition {device.device} (placement {mine.start}+{mine.size}) overlaps"
            f" {held.device} (placement {theirs.start}+{theirs.size}) of {other.who}",
            OVERLAP,
        )


def _sum(one: Asked, held: Sequence[_Held]) -> Iterator[tuple[str, str]]:
    """The shares prepared on the device, this one added, fit its memory."""
    device = one.device
    shares = [h for h in held if h.device.device == device.device and not h.device.admin_access]
    taken = sum(one.capacity if h.device.memory == UNSIZED else h.device.memory for h in shares)
    if taken + device.memory > one.capacity:
        holders = ", ".join(sorted({_holder(h) for h in shares if h.device.memory}))
        yield (
            f"{one.field}.consumedCapacity.{MEMORY}: a share of {_bytes(device.memory)} of"
            f" {device.device}"
            f" would bring its prepared shares to {_bytes(taken + device.memory)}, more than its"
            f" memory ({_bytes(one.capacity)}; held by {holders})",
            OVERCOMMIT,
        )


def _holder(held: _Held) -> str:
    if held.device.memory == UNSIZED:
        return f"{held.who}, whose share's size was not recorded: counted as all of it"
    return held.who


def _is_share(device: PreparedDevice) -> bool:
    """A memory share (sized, or recorded without its size): a share ID alone is none."""
    return bool(device.share_id and device.memory)


def admin_requests(claim: Mapping[str, Any]) -> frozenset[str]:
    """The names of the claim's requests whose spec asks admin access (`exactly.adminAccess`
    in resource.k8s.io/v1). A `firstAvailable` subrequest (`main/sub`) cannot ask it: its API
    has no such field, and Kubernetes' allocator grants it none."""
    spec = claim.get("spec")
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    requests = devices.get("requests") if isinstance(devices, Mapping) else None
    asked = set()
    for request in requests if isinstance(requests, list) else []:
        exactly = request.get("exactly") if isinstance(request, Mapping) else None
        if isinstance(exactly, Mapping) and exactly.get("adminAccess") is True:
            asked.add(str(request.get("name", "")))
    return frozenset(asked)


def gpu_of(device: PreparedDevice) -> str:
    """The name of the GPU a device is, or is part of: `gpu-<minor>` (`slices.device_name`,
    `migpartitions.partition_name`)."""
    return device.device.partition("-mig-")[0]


def _is_whole(device: PreparedDevice) -> bool:
    return "-mig-" not in device.device


def _bytes(amount: int) -> str:
    """An amount of memory as NVML counts it: MiB when whole, else bytes."""
    return f"{amount // MIB} MiB" if amount % MIB == 0 else f"{amount} bytes"
