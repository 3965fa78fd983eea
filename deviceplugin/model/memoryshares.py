"""GPU memory shares (`dra serve --gpu-sharing memory`): how a whole GPU is published so that
the scheduler hands out parts of its memory (consumable capacity, KEP-5075).

A shareable GPU has `allowMultipleAllocations: true` and a `memory` capacity whose
`requestPolicy` says: a claim that asks for no memory gets all of it (`default`, so the GPU
alone), one that asks gets at least SHARE_MIN, rounded up to whole SHARE_STEPs, at most the
GPU's memory. The API server requires `default` and `max` to lie on the step from `min`, and
NVML reports memory in MiB (an "80 GB" H100 has 81559 MiB), so the step is one MiB: the one step
every GPU's memory lies on. MIG devices keep their fixed size and are never shareable.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

GpuSharing = Literal["off", "memory"]
GPU_SHARING: tuple[GpuSharing, ...] = ("off", "memory")
GPU_SHARING_ENV = "DP_DRA_GPU_SHARING"
MEMORY = "memory"  # the capacity a share consumes
SHARE_MIN = 1 << 30  # smaller than a CUDA context plus any useful working set
SHARE_STEP = 1 << 20
MEMORY_LIMIT_ENV = "NVIDIA_GPU_MEMORY_LIMIT"  # the container toolkit's per-container limit

JsonObject = dict[str, Any]


def gpu_sharing(value: str | None) -> GpuSharing:
    """`value` as a sharing mode (unset: off); ValueError naming the choices otherwise."""
    for mode in GPU_SHARING:
        if (value or "off") == mode:
            return mode
    raise ValueError(f"must be {' or '.join(GPU_SHARING)}, got {value!r}")


def request_policy(total: int, quantity: Callable[[int], str]) -> JsonObject:
    """The `requestPolicy` of a GPU with `total` bytes, each value written by `quantity`."""
    bounds = {"min": SHARE_MIN, "max": total, "step": SHARE_STEP}
    return {
        "default": quantity(total),
        "validRange": {key: quantity(value) for key, value in bounds.items()},
    }
