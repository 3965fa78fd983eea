"""The prepared claims, on disk: `<kubelet-root>/plugins/<driver>/checkpoint.json`.

The kubelet calls NodePrepareResources again for claims it already prepared (after its own
restart, or ours) and expects the same answer, and calls NodeUnprepareResources for claims we
prepared before a restart. So every change to the set of prepared claims is saved before the
call returns, atomically (a temp file renamed over the checkpoint: a crash leaves the old file
or the new one), and loaded at start-up.

The file is `{"version": 2, "checksum": "sha256:<hex>", "data": {"bootID": ..., "claims":
{<uid>: ...}}}`; the checksum covers `data` serialised with sorted keys and no spaces, so a torn
or edited file is detected (`CheckpointError`) instead of answering the kubelet from garbage.
Each claim has a `state`: `PrepareStarted` while its CDI spec is being written, then
`PrepareCompleted`, so a crash in between is found and undone at start-up. `bootID` is the
node's boot that wrote the file: prepared state does not survive a reboot. Each device also
records how it was set up, each key only when set (`adminAccess`, `shareID`, `sharing`,
`timeSliceInterval`, `memoryShare`: the bytes of its memory share, which admission sums (a
share ID recorded without it, by an earlier driver, is `UNSIZED`),
`mpsDaemon` `{uuid, pipeDir, pid}`: the device's MPS control daemon, and `migPartition` for a
dynamic MIG partition: `migrecord.py`).

Older versions are read and migrated one step at a time (`_MIGRATIONS`: version 1 had neither
states nor a boot ID; its claims were all complete), and the next save writes the current
version. A version newer than this driver's is refused, not guessed at.

The file is read as untrusted input: only a regular file (never through a symlink) of at most
`MAX_BYTES`, opened without blocking, so a FIFO, a device or a directory in its place is refused
without being read. Whatever cannot be trusted (those, text that is not UTF-8 JSON, nesting
deeper than the parser goes, a newer version, a wrong checksum) is a `CheckpointError`, the only
exception `load` raises. The caller then moves it aside (`set_aside`): a newer driver's claims
stay on disk for an operator. Until it is moved, this object refuses to save over it.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from deviceplugin.dra.migrecord import MigPartition, partition_entry, read_partition
from deviceplugin.model.errors import DevicePluginError
from deviceplugin.model.record import record
from deviceplugin.node.cdiwriter import SpecWriter, describe, render
from deviceplugin.node.regularfile import NotRegularError, not_regular, read_regular

VERSION = 2
FILE_NAME = "checkpoint.json"
BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")
STARTED = "PrepareStarted"
COMPLETED = "PrepareCompleted"
STATES = (STARTED, COMPLETED)
# About 15,000 claims; a node runs a few hundred pods. A larger file is not ours.
MAX_BYTES = 8 * 1024 * 1024
SET_ASIDE_INFIX = ".unusable-"
# The memory of a share whose size the checkpoint does not hold (written before sizes were):
# admission counts it as the whole device.
UNSIZED = -1


class CheckpointError(DevicePluginError):
    """The checkpoint exists but cannot be trusted: unreadable, wrong version or checksum."""


@record(frozen=True)
class MpsDaemon:
    """The MPS control daemon a device was prepared with (`mpsdevices.py`)."""

    uuid: str  # the GPU or MIG device it serves
    pipe_dir: str
    pid: int = 0  # 0 until it is started


@record(frozen=True)
class PreparedDevice:
    """One allocated device as NodePrepareResources reports it, and how it was set up."""

    requests: tuple[str, ...]
    pool: str
    device: str
    cdi_ids: tuple[str, ...]
    admin_access: bool = False
    share_id: str = ""
    sharing: str = ""  # "TimeSlicing", or "" when not shared
    interval: str = ""  # the GPU's time slice when time-sliced
    partition: MigPartition | None = None  # a dynamic MIG partition this driver cuts
    mps: MpsDaemon | None = None  # with MPS sharing
    memory: int = 0  # bytes of its memory share (`--gpu-sharing memory`), 0 for none, or UNSIZED


@record(frozen=True)
class PreparedClaim:
    """A claim this driver prepared (or is preparing), and the answer it gave."""

    namespace: str
    name: str
    devices: tuple[PreparedDevice, ...]
    state: str = COMPLETED

    @property
    def completed(self) -> bool:
        return self.state == COMPLETED

    @property
    def partitions(self) -> tuple[MigPartition, ...]:
        """The dynamic MIG partitions it cuts."""
        return tuple(d.partition for d in self.devices if d.partition is not None)


@record(frozen=True)
class Saved:
    """What a checkpoint file holds: the boot that wrote it ("" when unknown: version 1) and the
    claims by UID; `version` is the file's own, before migration."""

    boot_id: str
    claims: Mapping[str, PreparedClaim]
    version: int = VERSION


class Checkpoint:
    """Reads and writes one checkpoint file, for the boot `boot_id`."""

    def __init__(self, path: Path, boot_id: str = "") -> None:
        self.path = path
        self.boot_id = boot_id
        self._writer = SpecWriter(path)
        self._refused = False  # the file on disk was refused and is still there

    def load(self) -> Saved:
        """The file's contents in the current version; empty when there is no file yet. Raises
        CheckpointError, and nothing else, whatever the file holds."""
        try:
            raw = self._read()
        except FileNotFoundError:
            self._refused = False
            return Saved(self.boot_id, {})
        except OSError as err:
            self._refused = True
            raise CheckpointError(f"cannot read {self.path}: {describe(err)}") from err
        try:
            saved = self._parse(raw)
        except CheckpointError:
            self._refused = True
            raise
        self._refused = False
        return saved

    def set_aside(self) -> Path:
        """Move the file refused by `load` out of the way, unread and unchanged, as
        `checkpoint.json.unusable-<UTC time>`; its new path. Raises OSError."""
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        target = self.path.with_name(f"{self.path.name}{SET_ASIDE_INFIX}{stamp}")
        count = 1
        while os.path.lexists(target):  # callers hold the node's lock: no one else renames
            count += 1
            target = self.path.with_name(f"{self.path.name}{SET_ASIDE_INFIX}{stamp}-{count}")
        os.rename(self.path, target)
        self._refused = False
        return target

    def save(self, claims: Mapping[str, PreparedClaim]) -> None:
        """Replace the file with `claims`, for this boot, atomically. Raises OSError, also
        instead of replacing a file `load` refused, or writing one it would refuse."""
        if self._refused:
            why = "holds a checkpoint that cannot be trusted and is not set aside"
            raise OSError(errno.EEXIST, f"{self.path} {why}")
        data = {
            "bootID": self.boot_id,
            "claims": {uid: _entry(claim) for uid, claim in sorted(claims.items())},
        }
        document = {"version": VERSION, "checksum": checksum(data), "data": data}
        if len(render(document)) > MAX_BYTES:
            raise OSError(errno.EFBIG, f"{len(claims)} claims need more than {MAX_BYTES} bytes")
        self._writer.write(document)

    def _read(self) -> bytes:
        """The file's bytes: a regular file, not followed through a symlink, opened without
        blocking and checked on the open descriptor before anything is read. Raises OSError;
        CheckpointError for anything but a regular file of at most MAX_BYTES."""
        kind = not_regular(os.lstat(self.path).st_mode)  # a device is not even opened
        if kind is not None:
            raise CheckpointError(f"{self.path}: it is {kind}, not a regular file")
        try:
            return read_regular(str(self.path), MAX_BYTES, follow_symlinks=False)
        except (NotRegularError, ValueError) as err:  # swapped in since the lstat, or too big
            raise CheckpointError(str(err)) from None

    def _parse(self, raw: bytes) -> Saved:
        try:
            document = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as err:
            raise CheckpointError(f"{self.path}: not UTF-8 ({err.reason})") from None
        except RecursionError:
            raise CheckpointError(f"{self.path}: nested too deeply to be a checkpoint") from None
        except ValueError as err:
            raise CheckpointError(f"{self.path}: not JSON: {err}") from None
        try:
            version = document.get("version")
            if version not in range(1, VERSION + 1) or isinstance(version, bool):
                newer = isinstance(version, int) and version > VERSION
                raise CheckpointError(
                    f"{self.path}: version {_clipped(version)}, this driver reads versions 1 to "
                    f"{VERSION}" + (" (it was written by a newer driver)" if newer else "")
                )
            data = document["data"]
            if document.get("checksum") != checksum(data):
                raise CheckpointError(f"{self.path}: checksum mismatch")
            for step in range(version, VERSION):
                data = _MIGRATIONS[step](data)
            claims = {uid: _claim(entry) for uid, entry in data["claims"].items()}
            return Saved(str(data["bootID"]), claims, version)
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as err:
            raise CheckpointError(f"{self.path}: malformed: {_clipped(err)}") from err


def read_boot_id(path: Path = BOOT_ID_FILE) -> str:
    """This boot's ID, as the kernel gives it; "" when it cannot be read (no reboot is then
    detected). Raises nothing."""
    try:
        return path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return ""


def checksum(data: Any) -> str:
    """`sha256:<hex>` of `data` as canonical JSON."""
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def _clipped(value: object) -> str:
    """`value`'s repr for a message, cut short: the file's content is not worth a long line."""
    shown = repr(value)
    return shown if len(shown) <= 80 else f"{shown[:80]}…"


def _from_v1(data: Mapping[str, Any]) -> dict[str, Any]:
    """Version 1 saved only completed claims and no boot ID."""
    claims = {uid: {**entry, "state": COMPLETED} for uid, entry in data["claims"].items()}
    return {"bootID": "", "claims": claims}


# version -> the step from it to the next version
_MIGRATIONS: dict[int, Callable[[Mapping[str, Any]], dict[str, Any]]] = {1: _from_v1}


def _entry(claim: PreparedClaim) -> dict[str, Any]:
    return {
        "state": claim.state,
        "namespace": claim.namespace,
        "name": claim.name,
        "devices": [_device_entry(d) for d in claim.devices],
    }


def _device_entry(device: PreparedDevice) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "requests": list(device.requests),
        "pool": device.pool,
        "device": device.device,
        "cdiDeviceIDs": list(device.cdi_ids),
    }
    optional = {
        "adminAccess": device.admin_access,
        "shareID": device.share_id,
        "sharing": device.sharing,
        "timeSliceInterval": device.interval,
        "memoryShare": max(device.memory, 0),  # an UNSIZED share stays unsized
    }
    entry.update({key: value for key, value in optional.items() if value})
    if device.partition is not None:
        entry["migPartition"] = partition_entry(device.partition)
    if device.mps is not None:
        daemon = device.mps
        entry["mpsDaemon"] = {"uuid": daemon.uuid, "pipeDir": daemon.pipe_dir, "pid": daemon.pid}
    return entry


def _daemon(entry: Mapping[str, Any] | None) -> MpsDaemon | None:
    if entry is None:
        return None
    pid = entry["pid"]
    if not isinstance(pid, int) or isinstance(pid, bool) or pid < 0:
        raise ValueError(f"mpsDaemon.pid {pid!r} is not a process ID")
    return MpsDaemon(str(entry["uuid"]), str(entry["pipeDir"]), pid)


def _memory(device: Mapping[str, Any]) -> int:
    """The share's size; UNSIZED for a share ID whose size was not recorded."""
    if "memoryShare" not in device:
        return UNSIZED if device.get("shareID") else 0
    value = device["memoryShare"]
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"memoryShare {_clipped(value)} is not a number of bytes")
    return value


def _claim(entry: Mapping[str, Any]) -> PreparedClaim:
    state = entry["state"]
    if state not in STATES:
        raise ValueError(f"state {state!r} is not one of {', '.join(STATES)}")
    return PreparedClaim(
        namespace=str(entry["namespace"]),
        name=str(entry["name"]),
        state=state,
        devices=tuple(
            PreparedDevice(
                requests=tuple(str(r) for r in d["requests"]),
                pool=str(d["pool"]),
                device=str(d["device"]),
                cdi_ids=tuple(str(i) for i in d["cdiDeviceIDs"]),
                admin_access=d.get("adminAccess") is True,
                share_id=str(d.get("shareID", "")),
                sharing=str(d.get("sharing", "")),
                interval=str(d.get("timeSliceInterval", "")),
                partition=read_partition(d["migPartition"]) if "migPartition" in d else None,
                mps=_daemon(d.get("mpsDaemon")),
                memory=_memory(d),
            )
            for d in entry["devices"]
        ),
    )
