"""A checkpoint file that is hostile or damaged: whatever stands at `checkpoint.json` (bytes
that are not UTF-8 JSON, nesting 200,000 deep, 9 MiB, a FIFO, a symlink to /dev/zero, a
directory, a newer driver's file, a wrong checksum), the real Preparer starts, logs it, moves
it aside unread and unchanged, and prepares claims from an empty state; the same when the file
goes bad while it serves. And the property: any bytes load as claims or as CheckpointError."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deviceplugin.dra.checkpoint import (
    MAX_BYTES,
    VERSION,
    Checkpoint,
    CheckpointError,
    PreparedClaim,
    Saved,
    checksum,
)
from deviceplugin.dra.prepare import ClaimRef, NodeDevices, Preparer
from deviceplugin.model.cdi import CdiOptions, HostScan
from deviceplugin.model.log import FIELDS

BOOT = "3f1c6a52-8d3e-4b7a-9c0d-1e2f3a4b5c6d"
UID_A = "1f0e0c4a-0000-4000-8000-00000000000a"
UID_B = "1f0e0c4a-0000-4000-8000-00000000000b"
NO_DEVICES = PreparedClaim("default", "a", ())
FUZZ = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _document(claims: dict[str, PreparedClaim], version: int = VERSION) -> bytes:
    """A file as a driver of `version` would write it, holding `claims`."""
    data = {
        "bootID": BOOT,
        "claims": {
            uid: {"state": c.state, "namespace": c.namespace, "name": c.name, "devices": []}
            for uid, c in claims.items()
        },
    }
    return json.dumps({"version": version, "checksum": checksum(data), "data": data}).encode()


def _regular(content: bytes) -> Callable[[Path], object]:
    return lambda path: path.write_bytes(content)


def _oversize(path: Path) -> None:
    with path.open("wb") as file:
        file.truncate(MAX_BYTES + 1)  # sparse: no disk used


def _bad_checksum(path: Path) -> None:
    document = json.loads(_document({UID_A: NO_DEVICES}))
    document["data"]["claims"][UID_A]["name"] = "edited"
    path.write_text(json.dumps(document))


# form -> how it is made, and what the log says of it
FORMS: dict[str, tuple[Callable[[Path], object], str]] = {
    "not-utf8": (_regular(b'{"version": 2, "data": "\xff\xfe"}'), "not UTF-8"),
    "deep": (_regular(b"[" * 200_000 + b"]" * 200_000), "nested too deeply"),
    "oversize": (_oversize, f"{MAX_BYTES + 1} bytes, over the limit of {MAX_BYTES}"),
    "newer-version": (
        _regular(_document({UID_A: NO_DEVICES}, VERSION + 1)),
        "written by a newer driver",
    ),
    "bad-checksum": (_bad_checksum, "checksum mismatch"),
    "fifo": (os.mkfifo, "it is a named pipe (FIFO), not a regular file"),
    "directory": (Path.mkdir, "it is a directory, not a regular file"),
    "symlink-to-dev-zero": (
        lambda path: path.symlink_to("/dev/zero"),
        "it is a symbolic link, not a regular file",
    ),
    "device": (  # /dev/zero's numbers
        lambda path: os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 5)),
        "it is a character device, not a regular file",
    ),
}


def _fingerprint(path: Path) -> tuple[int, str, bytes]:
    """What a file is, unread when it is not a regular file: its type, a symlink's target and
    a regular file's first bytes."""
    info = os.lstat(path)
    if os.path.islink(path):
        return info.st_mode, os.readlink(path), b""
    if path.is_file():
        with path.open("rb") as file:
            return info.st_mode, "", file.read(4096)
    return info.st_mode, "", b""


@pytest.mark.parametrize("form", list(FORMS))
def test_an_unusable_checkpoint_is_set_aside_unchanged_and_claims_are_prepared_anew(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, form: str
) -> None:
    path = tmp_path / "checkpoint.json"
    make, message = FORMS[form]
    try:
        make(path)
    except PermissionError:
        pytest.skip("creating a device node needs CAP_MKNOD")
    before = _fingerprint(path)
    preparer = _preparer(tmp_path)

    async def body() -> None:
        await asyncio.wait_for(preparer.load(), 10)  # a FIFO or /dev/zero never ends a read
        outcomes = await preparer.prepare([ClaimRef("default", "b", UID_B)])
        assert outcomes[UID_B].error == ""

    with caplog.at_level(logging.INFO):
        asyncio.run(body())
    (aside,) = tmp_path.glob("checkpoint.json.unusable-*")
    assert _fingerprint(aside) == before
    assert Checkpoint(path).load().claims.keys() == {UID_B}
    (logged,) = _fields(caplog, "dra.checkpoint.unusable")
    assert message in logged["error"] and logged["set_aside"] == str(aside)
    assert preparer.unusable is not None and preparer.unusable.count == 1
    assert preparer.unusable.set_aside == str(aside)


def test_a_checkpoint_that_goes_bad_while_serving_is_set_aside_and_memory_is_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "checkpoint.json"
    path.write_bytes(_document({UID_A: NO_DEVICES}))
    preparer = _preparer(tmp_path)
    newer = _document({UID_A: NO_DEVICES}, VERSION + 1)

    async def body() -> None:
        await preparer.load()
        assert preparer.prepared.keys() == {UID_A}
        path.write_bytes(newer)  # a newer driver on the node wrote it
        outcomes = await preparer.prepare([ClaimRef("default", "b", UID_B)])
        assert outcomes[UID_B].error == ""

    with caplog.at_level(logging.ERROR):
        asyncio.run(body())
    assert Checkpoint(path).load().claims.keys() == {UID_A, UID_B}
    (aside,) = tmp_path.glob("checkpoint.json.unusable-*")
    assert aside.read_bytes() == newer
    (logged,) = _fields(caplog, "dra.checkpoint.unusable")
    assert "written by a newer driver" in logged["error"]


def test_each_unusable_checkpoint_gets_its_own_name(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    checkpoint = Checkpoint(path)
    for content in (b"one", b"two", b"three"):  # within a second: the same time stamp
        path.write_bytes(content)
        with pytest.raises(CheckpointError):
            checkpoint.load()
        checkpoint.set_aside()
    aside = sorted(tmp_path.glob("checkpoint.json.unusable-*"))
    assert {p.read_bytes() for p in aside} == {b"one", b"two", b"three"}


def test_a_refused_checkpoint_not_set_aside_is_never_saved_over(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    newer = _document({UID_A: NO_DEVICES}, VERSION + 1)
    path.write_bytes(newer)
    checkpoint = Checkpoint(path, BOOT)
    with pytest.raises(CheckpointError, match="newer driver"):
        checkpoint.load()
    with pytest.raises(OSError, match="cannot be trusted"):
        checkpoint.save({UID_B: NO_DEVICES})
    assert path.read_bytes() == newer
    checkpoint.set_aside()
    checkpoint.save({UID_B: NO_DEVICES})
    assert checkpoint.load() == Saved(BOOT, {UID_B: NO_DEVICES})


def test_claims_that_would_make_a_checkpoint_too_large_to_load_are_not_saved(
    tmp_path: Path,
) -> None:
    path = tmp_path / "checkpoint.json"
    checkpoint = Checkpoint(path, BOOT)
    checkpoint.save({UID_A: NO_DEVICES})
    huge = {f"uid-{n}": PreparedClaim("default", "x" * (MAX_BYTES // 8), ()) for n in range(9)}
    with pytest.raises(OSError, match="need more than"):
        checkpoint.save(huge)
    assert checkpoint.load().claims.keys() == {UID_A}


# --- the property -------------------------------------------------------------------------------


def _loads_or_refuses(tmp_path: Path, content: bytes) -> None:
    """Any bytes load as claims, or raise CheckpointError; nothing else."""
    path = tmp_path / "checkpoint.json"
    path.write_bytes(content)
    try:
        saved = Checkpoint(path, BOOT).load()
    except CheckpointError:
        return
    assert all(isinstance(claim, PreparedClaim) for claim in saved.claims.values())


@FUZZ
@given(content=st.binary(max_size=2000))
def test_any_bytes_load_or_are_refused(tmp_path: Path, content: bytes) -> None:
    _loads_or_refuses(tmp_path, content)


KEYS = ["state", "namespace", "name", "devices", "requests", "pool", "device", "cdiDeviceIDs"]
KEYS += ["adminAccess", "shareID", "sharing", "timeSliceInterval", "memoryShare", "claims"]
KEYS += ["bootID"]
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(max_size=10)
    | st.sampled_from(["PrepareStarted", "PrepareCompleted", "requests", "devices"]),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=5), children, max_size=6)
    ),
    max_leaves=40,
)


@FUZZ
@given(
    version=st.sampled_from([1, 2, 3, 0, "2", True, 2.0, None]),
    data=json_values | st.fixed_dictionaries({"bootID": json_values, "claims": json_values}),
    sealed=st.booleans(),
)
def test_any_sealed_json_loads_or_is_refused(
    tmp_path: Path, version: Any, data: Any, sealed: bool
) -> None:
    """Documents whose checksum is right, so that the content reaches the claims' reader."""
    document = {"version": version, "checksum": checksum(data) if sealed else "x", "data": data}
    _loads_or_refuses(tmp_path, json.dumps(document).encode())


def _fields(caplog: pytest.LogCaptureFixture, event: str) -> list[dict[str, Any]]:
    return [getattr(r, FIELDS) for r in caplog.records if r.getMessage() == event]


def _preparer(root: Path) -> Preparer:
    devices = NodeDevices({}, HostScan(), CdiOptions())
    checkpoint = Checkpoint(root / "checkpoint.json", BOOT)
    return Preparer(_Api(), checkpoint, root / "cdi", "gpu.nvidia.com", "node-1", devices)


class _Api:
    """Every claim exists, allocated devices of another driver only: it prepares to none."""

    async def read_claim(self, namespace: str, name: str) -> dict[str, Any]:
        uid = {"a": UID_A, "b": UID_B}[name]
        devices = {"results": [{"driver": "other.example.com", "device": "d", "pool": "p"}]}
        return {
            "metadata": {"namespace": namespace, "name": name, "uid": uid},
            "status": {"allocation": {"devices": devices}},
        }
