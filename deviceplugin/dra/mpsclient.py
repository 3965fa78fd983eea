"""What a claim with MPS sharing gets in its containers, and the rules that keep one control
daemon per device: pure, over the claim's `mpsConfig` (`opaquetypes.MpsSettings`).

A container reaches its device's daemon as NVIDIA's DRA driver sets it up: the daemon's pipe
directory mounted at `/tmp/nvidia-mps` with `CUDA_MPS_PIPE_DIRECTORY` naming it, and the
daemon's shm directory at `/dev/shm`. Unlike NVIDIA's driver, which runs one daemon per claim
with the claim's limits as the daemon's defaults, this driver runs one daemon per device, shared
by every claim on it, so each claim's limits are given to its own clients, in the variables a
CUDA client reads when it connects: `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` and
`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` (`<ordinal>=<MiB>M`; the claim's one device is ordinal 0).

A container has one pipe directory, so a claim shares at most one device through MPS; and a
device whose daemon runs is in EXCLUSIVE_PROCESS mode, where only the daemon's server may hold a
context, so the claims on one device either all use MPS or none does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from deviceplugin.dra.opaquetypes import MPS, MpsSettings, OpaqueConfigError
from deviceplugin.model.record import record

PIPE_IN_CONTAINER = "/tmp/nvidia-mps"  # NVIDIA's DRA driver's
SHM_IN_CONTAINER = "/dev/shm"
PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
THREADS_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
PINNED_ENV = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
MOUNT_OPTIONS = ("rw", "nosuid", "nodev", "bind")
MIB = 1 << 20


@record(frozen=True)
class DaemonHome:
    """Where one device's daemon lives on the host: its pipe, log and shm directories."""

    pipe_dir: str
    log_dir: str
    shm_dir: str

    @classmethod
    def under(cls, root: Path, device: str) -> DaemonHome:
        """`<root>/<device>/{pipe,log,shm}`: named by the short device name, as the pipe's
        socket path must fit AF_UNIX."""
        home = root / device
        return cls(str(home / "pipe"), str(home / "log"), str(home / "shm"))


def client_edits(
    settings: MpsSettings, uuid: str, ceiling: int, ceiling_name: str, home: DaemonHome
) -> dict[str, Any]:
    """The CDI edits (env, mounts) that point a container at `home`'s daemon with the claim's
    limits. `ceiling` (bytes, named by `ceiling_name`) is the most pinned memory the claim may
    ask for on the device `uuid`. Raises OpaqueConfigError naming the mpsConfig field."""
    env = [f"{PIPE_ENV}={PIPE_IN_CONTAINER}"]
    if settings.thread_percentage is not None:
        env.append(f"{THREADS_ENV}={settings.thread_percentage}")
    limit = _pinned_limit(settings, uuid, ceiling, ceiling_name)
    if limit is not None:
        env.append(f"{PINNED_ENV}=0={limit // MIB}M")
    mounts = [
        {"hostPath": home.pipe_dir, "containerPath": PIPE_IN_CONTAINER},
        {"hostPath": home.shm_dir, "containerPath": SHM_IN_CONTAINER},
    ]
    return {"env": env, "mounts": [{**m, "options": list(MOUNT_OPTIONS)} for m in mounts]}


def _pinned_limit(settings: MpsSettings, uuid: str, ceiling: int, ceiling_name: str) -> int | None:
    """The pinned memory limit of the claim's device, as NVIDIA's driver resolves it: the
    default, overridden by an entry keyed by the device's index in the claim (0) or its UUID."""
    limit, field = settings.pinned_limit, "defaultPinnedDeviceMemoryLimit"
    for key, value in settings.per_device:
        where = f"defaultPerDevicePinnedMemoryLimit[{key}]"
        if key not in ("0", uuid):
            raise OpaqueConfigError(
                f"{settings.path}.{where}",
                f"names no device of this claim: its one MPS device is 0, or {uuid}",
            )
        limit, field = value, where
    if limit is not None and limit > ceiling:
        raise OpaqueConfigError(
            f"{settings.path}.{field}",
            f"{limit // MIB} MiB is more than {ceiling_name} ({ceiling // MIB} MiB)",
        )
    return limit


def second_mps_device(claim: str, first: str, second: str, index: int) -> str:
    """Why a claim may not share a second device through MPS."""
    return (
        f"ResourceClaim {claim}: status.allocation.devices.results[{index}]: {second} asks for"
        f" MPS as {first} does: a container reaches one MPS control daemon, and this driver"
        " runs one per device, so a claim shares one device through MPS"
    )


def mixing_problem(held: str, wanted: str, origin: str) -> str | None:
    """Why a device prepared with sharing `held` for another claim cannot be prepared with
    `wanted` (`origin`: the config entry that asks it, "" for none); None when it can."""
    if (held == MPS) == (wanted == MPS):
        return None
    asks = f"{origin} asks for {wanted or 'no sharing'}" if origin else "no config asks for MPS"
    runs = (
        "runs an MPS control daemon"
        if held == MPS
        else f"is used without MPS ({held or 'no sharing'})"
    )
    return (
        f"{asks}, but the device {runs} for another claim: claims on one device all use MPS"
        " or none does"
    )
