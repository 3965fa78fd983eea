"""MIG profile strings -> the attributes NVML reports for such a MIG device.

A simulated node names each MIG device by the profile nvidia-smi shows (`1g.10gb`, `1c.2g.20gb`,
`1g.10gb+me`). NVML never reports that string: it reports a GPU-instance profile (enum and
driver id), slice counts and a memory size. This module turns the string into those numbers,
using the published per-model tables (nvidia-smi `mig -lgip`) for known GPU models, and for
other models a memory size that the 1/8-rounding rule maps back to the profile's `<mem>gb`.
"""

from __future__ import annotations

import re
from dataclasses import replace

from deviceplugin.model.record import record

# NVML_GPU_INSTANCE_PROFILE_* enum by (GPU slices, suffix).
_GI_ENUM = {
    (1, ""): 0x0,
    (2, ""): 0x1,
    (3, ""): 0x2,
    (4, ""): 0x3,
    (7, ""): 0x4,
    (8, ""): 0x5,
    (6, ""): 0x6,
    (1, "+me"): 0x7,
    (2, "+me"): 0x8,
    (1, "+gfx"): 0xA,
    (2, "+gfx"): 0xB,
    (4, "+gfx"): 0xC,
    (1, "-me"): 0xD,
    (2, "-me"): 0xE,
    (1, "+me.all"): 0xF,
    (2, "+me.all"): 0x10,
    (3, "+gfx"): 0x11,
}
# NVML_COMPUTE_INSTANCE_PROFILE_* enum by compute slices.
CI_ENUM = {1: 0x0, 2: 0x1, 3: 0x2, 4: 0x3, 7: 0x4, 8: 0x5, 6: 0x6}

_PROFILE = r"(?:(\d+)c\.)?(\d+)g\.(\d+)gb(\+me\.all|\+me|\+gfx|-me)?"


@record(frozen=True)
class GiProfile:
    """One GPU-instance profile of a model: enum, driver id, size and engines."""

    enum: int
    id: int
    slices: int
    memory_mib: int
    multiprocessors: int
    decoders: int
    jpegs: int
    ofas: int


@record(frozen=True)
class MigShape:
    """What NVML reports about one MIG device (GPU instance + compute instance)."""

    gpu_instance: GiProfile
    compute_slices: int

    @property
    def compute_profile(self) -> int:
        return CI_ENUM[self.compute_slices]

    @property
    def multiprocessors(self) -> int:
        return self.gpu_instance.multiprocessors * self.compute_slices // self.gpu_instance.slices


def plausible_memory_mib(total_mib: int, gb: int) -> int:
    """A MIG memory size (a multiple of 128 MiB where possible) that the naming rule maps back
    to `gb` on a GPU with `total_mib`: the eighth of the GPU whose rounded size is closest."""
    total_gib = -(-total_mib // 1024)
    eighths = min(range(1, 9), key=lambda k: abs((k * total_gib + 4) // 8 - gb))
    upper = eighths * total_mib // 8
    aligned = upper // 128 * 128
    return aligned if aligned * 8 > (eighths - 1) * total_mib else upper


def _table(
    rows: dict[str, tuple[int, int, int | None, int, int, int, int]], total_mib: int
) -> dict[str, GiProfile]:
    """Rows: name -> (enum, driver id, MiB or None = derive, SMs, NVDEC, NVJPG, OFA)."""
    table = {}
    for name, (enum, driver_id, mib, sms, dec, jpg, ofa) in rows.items():
        slices = int(name.split("g.", 1)[0])
        size = mib if mib is not None else plausible_memory_mib(total_mib, _gb(name))
        table[name] = GiProfile(enum, driver_id, slices, size, sms, dec, jpg, ofa)
    return table


def _gb(name: str) -> int:
    return int(name.split("g.", 1)[1].split("gb", 1)[0])


_A30 = _table(
    {
        "1g.6gb": (0x0, 14, 5952, 14, 1, 0, 0),
        "1g.6gb+me": (0x7, 21, 5952, 14, 1, 1, 1),
        "2g.12gb": (0x1, 5, 11968, 28, 2, 0, 0),
        "2g.12gb+me": (0x8, 6, 11968, 28, 2, 1, 1),
        "4g.24gb": (0x3, 0, 24000, 56, 4, 1, 1),
    },
    24258,
)
_A100_40GB = _table(
    {
        "1g.5gb": (0x0, 19, 4864, 14, 0, 0, 0),
        "1g.5gb+me": (0x7, 20, 4864, 14, 1, 1, 1),
        "1g.10gb": (0x9, 15, 9856, 14, 1, 0, 0),
        "2g.10gb": (0x1, 14, 9856, 28, 1, 0, 0),
        "3g.20gb": (0x2, 9, 19968, 42, 2, 0, 0),
        "4g.20gb": (0x3, 5, 19968, 56, 2, 0, 0),
        "7g.40gb": (0x4, 0, 40192, 98, 5, 1, 1),
    },
    40536,
)
_A100_80GB = _table(
    {
        "1g.10gb": (0x0, 19, 9728, 14, 0, 0, 0),
        "1g.10gb+me": (0x7, 20, 9728, 14, 1, 1, 1),
        "1g.20gb": (0x9, 15, 19968, 14, 1, 0, 0),
        "2g.20gb": (0x1, 14, 19968, 28, 1, 0, 0),
        "3g.40gb": (0x2, 9, 40192, 42, 2, 0, 0),
        "4g.40gb": (0x3, 5, 40192, 56, 2, 0, 0),
        "7g.80gb": (0x4, 0, 80896, 98, 5, 1, 1),
    },
    81920,
)
_H100_80GB = _table(
    {
        "1g.10gb": (0x0, 19, 9856, 16, 1, 1, 0),
        "1g.10gb+me": (0x7, 20, 9856, 16, 1, 1, 1),
        "1g.20gb": (0x9, 15, 19968, 26, 1, 1, 0),
        "2g.20gb": (0x1, 14, 19968, 32, 2, 2, 0),
        "3g.40gb": (0x2, 9, 40192, 60, 3, 3, 0),
        "4g.40gb": (0x3, 5, 40192, 64, 4, 4, 0),
        "7g.80gb": (0x4, 0, 81152, 132, 7, 7, 1),
    },
    81559,
)
_H100_94GB = _table(
    {
        "1g.12gb": (0x0, 19, 10880, 16, 1, 1, 0),
        "1g.12gb+me": (0x7, 20, 10880, 16, 1, 1, 1),
        "1g.24gb": (0x9, 15, 22016, 26, 1, 1, 0),
        "2g.24gb": (0x1, 14, 22016, 32, 2, 2, 0),
        "3g.47gb": (0x2, 9, 47232, 60, 3, 3, 0),
        "4g.47gb": (0x3, 5, 47232, 64, 4, 4, 0),
        "7g.94gb": (0x4, 0, 94848, 132, 7, 7, 1),
    },
    95830,
)
_GH200_96GB = _table(
    {
        "1g.12gb": (0x0, 19, 11264, 16, 1, 1, 0),
        "1g.12gb+me": (0x7, 20, 11264, 16, 1, 1, 1),
        "1g.24gb": (0x9, 15, 23552, 26, 1, 1, 0),
        "2g.24gb": (0x1, 14, 23552, 32, 2, 2, 0),
        "3g.48gb": (0x2, 9, 47616, 60, 3, 3, 0),
        "4g.48gb": (0x3, 5, 47616, 64, 4, 4, 0),
        "7g.96gb": (0x4, 0, 95232, 132, 7, 7, 1),
    },
    97871,
)
_GH200_144GB = _table(
    {
        "1g.18gb": (0x0, 19, 17920, 16, 1, 1, 0),
        "1g.18gb+me": (0x7, 20, 17920, 16, 1, 1, 1),
        "1g.36gb": (0x9, 15, 36096, 26, 1, 1, 0),
        "2g.36gb": (0x1, 14, 36096, 32, 2, 2, 0),
        "3g.72gb": (0x2, 9, None, 60, 3, 3, 0),
        "4g.72gb": (0x3, 5, None, 64, 4, 4, 0),
        "7g.144gb": (0x4, 0, None, 132, 7, 7, 1),
    },
    147456,
)
_H200 = _table(
    {
        "1g.18gb": (0x0, 19, 16384, 16, 1, 1, 0),
        "1g.18gb+me": (0x7, 20, 16384, 16, 1, 1, 1),
        "1g.35gb": (0x9, 15, 33024, 26, 1, 1, 0),
        "2g.35gb": (0x1, 14, 33024, 32, 2, 2, 0),
        "3g.71gb": (0x2, 9, 71168, 60, 3, 3, 0),
        "4g.71gb": (0x3, 5, 71168, 64, 4, 4, 0),
        "7g.141gb": (0x4, 0, 143104, 132, 7, 7, 1),
    },
    143771,
)
_B200 = _table(
    {
        "1g.23gb": (0x0, 19, 22528, 18, 1, 1, 0),
        "1g.23gb+me": (0x7, 20, 22528, 18, 1, 1, 1),
        "1g.45gb": (0x9, 15, 45312, 30, 1, 1, 0),
        "2g.45gb": (0x1, 14, 45312, 36, 2, 2, 0),
        "3g.90gb": (0x2, 9, None, 54, 1, 1, 0),
        "4g.90gb": (0x3, 5, None, 72, 1, 1, 0),
        "7g.180gb": (0x4, 0, None, 144, 1, 1, 1),
    },
    183359,
)

# NVML device name -> the GPU-instance profiles that model offers.
KNOWN_MODELS: dict[str, dict[str, GiProfile]] = {
    "NVIDIA A30": _A30,
    "NVIDIA A100-SXM4-40GB": _A100_40GB,
    "NVIDIA A100-PCIE-40GB": _A100_40GB,
    "NVIDIA A100-SXM4-80GB": _A100_80GB,
    "NVIDIA A100 80GB PCIe": _A100_80GB,
    "NVIDIA H100 80GB HBM3": _H100_80GB,
    "NVIDIA H100 PCIe": _H100_80GB,
    "NVIDIA H100 NVL": _H100_94GB,
    "NVIDIA GH200 480GB": _GH200_96GB,
    "NVIDIA GH200 120GB": _GH200_96GB,
    "NVIDIA GH200 144G HBM3e": _GH200_144GB,
    "NVIDIA H200": _H200,
    "NVIDIA H200 NVL": _H200,
    "NVIDIA B200": _B200,
}


def resolve(gpu_name: str, total_mib: int, profile: str, memory_mib: int | None) -> MigShape:
    """The NVML view of `profile` on a GPU called `gpu_name`; `memory_mib` overrides the size
    (to model another driver release). Raises ValueError when the string is not a profile."""
    match = re.fullmatch(_PROFILE, profile)
    if match is None:
        raise ValueError(f"{profile!r} is not a MIG profile ([<c>c.]<g>g.<mem>gb[+me])")
    slices, gb, suffix = int(match.group(2)), int(match.group(3)), match.group(4) or ""
    compute_slices = int(match.group(1)) if match.group(1) else slices
    if compute_slices not in CI_ENUM or compute_slices > slices:
        raise ValueError(f"{profile!r}: {compute_slices} compute slices do not fit {slices}")
    gi_name = f"{slices}g.{gb}gb{suffix}"
    known = KNOWN_MODELS.get(gpu_name, {}).get(gi_name)
    if known is None:
        enum = _GI_ENUM.get((slices, suffix))
        if enum is None:
            raise ValueError(f"{profile!r}: no GPU-instance profile has {slices} slices{suffix}")
        engines = 1 if suffix in ("+me", "+me.all") else 0
        known = GiProfile(
            enum=enum,
            id=100 + enum,  # apart from every published driver id, so ids stay unique per GPU
            slices=slices,
            memory_mib=plausible_memory_mib(total_mib, gb),
            multiprocessors=14 * slices,
            decoders=slices,
            jpegs=engines,
            ofas=engines,
        )
    if memory_mib is not None:
        known = replace(known, memory_mib=memory_mib)
    return MigShape(gpu_instance=known, compute_slices=compute_slices)


def model_profiles(gpu_name: str) -> dict[int, GiProfile]:
    """The GPU-instance profiles a known model offers, by enum (empty for unknown models)."""
    return {gi.enum: gi for gi in KNOWN_MODELS.get(gpu_name, {}).values()}


# GPU-instance profiles that span two memory slices with one compute slice (1g.20gb on A100).
_TWO_MEMORY_SLICES = {0x9}
# Media-extension profiles: a GPU has one set of those engines, so one such instance at a time.
_MEDIA_EXTENSIONS = {0x7, 0x8, 0xF, 0x10}


def placements(gi: GiProfile, gpu_slices: int) -> list[tuple[int, int]]:
    """Where a GPU instance of profile `gi` may start on a GPU of `gpu_slices` compute slices,
    and how many memory slices it spans, as `nvidia-smi mig -lgipp` lists them: a 7-slice GPU
    has 8 memory slices, so 3g spans 4 and 7g all 8; 1g with two memory slices spans 2."""
    if gpu_slices == 7 and gi.slices in (3, 7):
        return [(0, 4), (4, 4)] if gi.slices == 3 else [(0, 8)]
    if gi.enum in _TWO_MEMORY_SLICES and gpu_slices % 2 == 1:
        return [(start, 2) for start in range(0, gpu_slices + 1, 2)]
    return [(start, gi.slices) for start in range(0, gpu_slices - gi.slices + 1, gi.slices)]


def instance_count(gi: GiProfile, gpu_slices: int) -> int:
    """How many GPU instances of `gi` a GPU holds at most (NVML's instanceCount)."""
    return 1 if gi.enum in _MEDIA_EXTENSIONS else len(placements(gi, gpu_slices))


def gpu_slices(profiles: dict[int, GiProfile]) -> int:
    """How many slices a GPU with these GPU-instance profiles has: its largest profile's."""
    return max((gi.slices for gi in profiles.values()), default=7)


def place_instances(instances: list[GiProfile], total_slices: int) -> list[tuple[int, int]] | None:
    """A placement for each GPU instance, (start, size) from its profile's placements, none
    overlapping another: the first such layout in order, as an operator could create them
    (4g then 3g fits in either order). None when the instances cannot all fit."""
    if sum(gi.slices for gi in instances) > total_slices:
        return None  # no search needed, and the search stays small: at most 8 instances
    chosen: list[tuple[int, int]] = []

    def fit(taken: int) -> bool:
        if len(chosen) == len(instances):
            return True
        for start, size in placements(instances[len(chosen)], total_slices):
            mask = ((1 << size) - 1) << start
            if not taken & mask:
                chosen.append((start, size))
                if fit(taken | mask):
                    return True
                chosen.pop()
        return False

    return chosen if fit(0) else None
