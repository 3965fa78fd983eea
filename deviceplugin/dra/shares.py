"""What Prepare makes of a memory share (`--gpu-sharing memory`): the allocation result's
`shareID` and `consumedCapacity.memory`, checked against what this node publishes.

The container learns its share through `NVIDIA_GPU_MEMORY_LIMIT` (bytes), the variable the
NVIDIA container toolkit's `apply-cuda-memory-limits` CDI hook reads. Only a whole GPU published
shareable takes a memory share: a MIG device has a fixed size (no share of any kind), and a
device published whole has no capacity to hand out, so a result that says otherwise was not
allocated from our slices. A share ID is refused on either as well: without a memory share
it would let two claims hold one device uncapped.
Time-slicing a shared GPU is refused: it would set the scheduling of a GPU whose other shares
belong to other claims.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from deviceplugin.dra.opaquetypes import TIME_SLICING
from deviceplugin.model.memoryshares import MEMORY
from deviceplugin.model.quantity import parse_quantity

MIG_FIXED = "is a MIG device, whose size is fixed: not shareable"
NO_MEMORY_SHARES = "is not published shareable (this driver runs without --gpu-sharing memory)"
BESIDE_PARTITIONS = (
    "is not published shareable (with --mig-mode dynamic a partitionable GPU is published whole"
    " beside its MIG partitions, never in shares)"
)


class ShareError(ValueError):
    """A share Prepare refuses; the message starts with the result's field (`.shareID`...)."""


def share_limit(result: Mapping[str, Any], device: str, not_shareable: str) -> int | None:
    """The memory (bytes) the result's share may use; None when it has no memory share.
    `not_shareable` says why the device is not published shareable ("" when it is)."""
    share = result.get("shareID")
    consumed = result.get("consumedCapacity")
    if not share and consumed is None:
        return None
    if not_shareable:
        field = ".shareID" if share else ".consumedCapacity"
        raise ShareError(f"{field}: {device} {not_shareable}")
    if not isinstance(consumed, Mapping) or MEMORY not in consumed:
        raise ShareError(f".consumedCapacity.{MEMORY}: required for a share of {device}")
    try:
        limit = parse_quantity(str(consumed[MEMORY]))
    except ValueError as err:
        raise ShareError(f".consumedCapacity.{MEMORY}: {err}") from err
    if limit <= 0:
        raise ShareError(f".consumedCapacity.{MEMORY}: must be positive, got {limit}")
    if not share:
        raise ShareError(f".shareID: required with consumedCapacity on {device}")
    return limit


def refuse_time_slicing(limit: int | None, sharing: str, origin: str) -> None:
    """A share of a GPU may not carry a time-slicing config."""
    if limit is not None and sharing == TIME_SLICING:
        raise ShareError(
            f": {origin} asks for time-slicing on a memory share of a GPU: the GPU's other"
            " shares belong to other claims, so its scheduling is not this claim's to set"
        )
