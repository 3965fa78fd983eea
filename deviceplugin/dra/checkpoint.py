"""The prepared claims, on disk: `<kubelet-root>/plugins/<driver>/checkpoint.json`.

The kubelet calls NodePrepareResources again for claims it already prepared (after its own
restart, or ours) and expects the same answer, and calls NodeUnprepareResources for claims we
prepared before a restart. So every change to the set of prepared claims is saved before the
call returns, atomically (a temp file renamed over the checkpoint: a crash leaves the old file
or the new one), and loaded at start-up.

The file is `{"version": 1, "checksum": "sha256:<hex>", "data": {"claims": {<uid>: ...}}}`;
the checksum covers `data` serialised with sorted keys and no spaces, so a torn or edited file
is detected (`CheckpointError`) instead of answering the kubelet from garbage. Each device also
records how it was set up, each key only when set (`adminAccess`, `shareID`, `sharing`,
`timeSliceInterval`), so files written before these existed load unchanged.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deviceplugin.model.errors import DevicePluginError
from deviceplugin.node.cdiwriter import SpecWriter

VERSION = 1
FILE_NAME = "checkpoint.json"


class CheckpointError(DevicePluginError):
    """The checkpoint exists but cannot be trusted: unreadable, wrong version or checksum."""


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class PreparedClaim:
    """A claim this driver prepared, and the answer it gave."""

    namespace: str
    name: str
    devices: tuple[PreparedDevice, ...]


class Checkpoint:
    """Reads and writes one checkpoint file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._writer = SpecWriter(path)

    def load(self) -> dict[str, PreparedClaim]:
        """The claims by UID; none when there is no file yet. Raises CheckpointError."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        except OSError as err:
            raise CheckpointError(f"cannot read {self.path}: {err.strerror}") from err
        try:
            document = json.loads(text)
            if document.get("version") != VERSION:
                raise CheckpointError(
                    f"{self.path}: version {document.get('version')!r}, expected {VERSION}"
                )
            data = document["data"]
            if document.get("checksum") != checksum(data):
                raise CheckpointError(f"{self.path}: checksum mismatch")
            return {uid: _claim(entry) for uid, entry in data["claims"].items()}
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise CheckpointError(f"{self.path}: malformed: {err!r}") from err

    def save(self, claims: Mapping[str, PreparedClaim]) -> None:
        """Replace the file with `claims`, atomically. Raises OSError."""
        data = {"claims": {uid: _entry(claim) for uid, claim in sorted(claims.items())}}
        self._writer.write({"version": VERSION, "checksum": checksum(data), "data": data})


def checksum(data: Any) -> str:
    """`sha256:<hex>` of `data` as canonical JSON."""
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def _entry(claim: PreparedClaim) -> dict[str, Any]:
    return {
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
    }
    entry.update({key: value for key, value in optional.items() if value})
    return entry


def _claim(entry: Mapping[str, Any]) -> PreparedClaim:
    return PreparedClaim(
        namespace=str(entry["namespace"]),
        name=str(entry["name"]),
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
            )
            for d in entry["devices"]
        ),
    )
