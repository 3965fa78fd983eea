"""The checkpoint file: a round trip, atomic replacement with nothing left behind, a version 1
file migrated, a file that cannot be trusted (edited, torn, a version from a newer driver)
detected rather than believed; and at start-up, a Prepare cut short rolled back and an earlier
boot's claims dropped, their CDI specs removed."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from deviceplugin.dra.checkpoint import (
    STARTED,
    Checkpoint,
    CheckpointError,
    PreparedClaim,
    PreparedDevice,
    Saved,
    checksum,
    read_boot_id,
)
from deviceplugin.dra.prepare import NodeDevices, Preparer, spec_file_name
from deviceplugin.model.cdi import CdiOptions, HostScan
from deviceplugin.model.log import FIELDS

CLAIMS = {
    "uid-1": PreparedClaim(
        "team-a",
        "pair",
        (
            PreparedDevice(("gpu",), "node-1", "gpu-4", ("k8s.gpu.nvidia.com/claim=uid-1-gpu-4",)),
            PreparedDevice(("mig",), "node-1", "gpu-0-mig-7-0", ("k/c=uid-1-gpu-0-mig-7-0",)),
        ),
    ),
    "uid-2": PreparedClaim("default", "none-of-ours", ()),
    "uid-3": PreparedClaim(
        "team-b",
        "set-up",
        (
            PreparedDevice(
                ("gpu",),
                "node-1",
                "gpu-5",
                ("k/c=uid-3-gpu-5-s",),
                share_id="s",
                interval="Long",
                memory=20 << 30,
            ),
            PreparedDevice(("mon",), "node-1", "gpu-6", ("k/c=uid-3-gpu-6",), admin_access=True),
        ),
    ),
}


BOOT = "3f1c6a52-8d3e-4b7a-9c0d-1e2f3a4b5c6d"


def test_a_saved_checkpoint_loads_back_with_its_boot_and_leaves_no_temp_file(
    tmp_path: Path,
) -> None:
    checkpoint = Checkpoint(tmp_path / "checkpoint.json", BOOT)
    assert checkpoint.load() == Saved(BOOT, {})
    checkpoint.save(CLAIMS)
    assert Checkpoint(tmp_path / "checkpoint.json", "another").load() == Saved(BOOT, CLAIMS)
    checkpoint.save({"uid-2": CLAIMS["uid-2"]})
    assert checkpoint.load() == Saved(BOOT, {"uid-2": CLAIMS["uid-2"]})
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.json"]


def test_devices_record_only_the_setup_keys_that_are_set(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    Checkpoint(path).save(CLAIMS)
    entries = json.loads(path.read_text())["data"]["claims"]
    assert entries["uid-1"]["state"] == "PrepareCompleted"
    assert set(entries["uid-1"]["devices"][0]) == {"requests", "pool", "device", "cdiDeviceIDs"}
    assert set(entries["uid-3"]["devices"][0]) - set(entries["uid-1"]["devices"][0]) == {
        "shareID",
        "timeSliceInterval",
        "memoryShare",
    }


def version_1(claims: dict[str, Any]) -> dict[str, Any]:
    """A file as version 1 wrote it: no boot ID, no states, the same checksum rule."""
    data = {"claims": claims}
    return {"version": 1, "checksum": checksum(data), "data": data}


def test_a_version_1_checkpoint_loads_as_completed_claims_and_is_saved_as_version_2(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "checkpoint.json"
    Checkpoint(path).save(CLAIMS)
    claims = json.loads(path.read_text())["data"]["claims"]
    for entry in claims.values():
        del entry["state"]
    path.write_text(json.dumps(version_1(claims)))
    assert Checkpoint(path, BOOT).load() == Saved("", CLAIMS, version=1)

    preparer = _preparer(tmp_path, BOOT)
    with caplog.at_level(logging.INFO):
        asyncio.run(preparer.load())
    assert preparer.prepared == CLAIMS  # no boot ID yet: nothing is taken for an earlier boot
    document = json.loads(path.read_text())
    assert document["version"] == 2 and document["data"]["bootID"] == BOOT
    assert Checkpoint(path).load() == Saved(BOOT, CLAIMS)


def _resealed(document: dict[str, Any], _: None) -> None:
    """The checksum made right again after an edit: only the content is wrong."""
    document["checksum"] = checksum(document["data"])


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        pytest.param(lambda d: d["data"]["claims"].pop("uid-2"), "checksum", id="edited"),
        pytest.param(
            lambda d: d.update(version=3),
            "version 3, this driver reads versions 1 to 2 ",
            id="newer",
        ),
        pytest.param(lambda d: d.update(version=0), "version 0", id="version-0"),
        pytest.param(lambda d: d.update(version="2"), "version '2'", id="version-string"),
        pytest.param(lambda d: d.pop("data"), "malformed", id="no-data"),
        pytest.param(
            lambda d: _resealed(d, d["data"]["claims"]["uid-2"].update(state="Halfway")),
            "state 'Halfway' is not one of PrepareStarted, PrepareCompleted",
            id="state",
        ),
    ],
)
def test_a_checkpoint_that_cannot_be_trusted_is_refused(
    tmp_path: Path, damage: object, message: str
) -> None:
    path = tmp_path / "checkpoint.json"
    Checkpoint(path).save(CLAIMS)
    document = json.loads(path.read_text())
    damage(document)  # type: ignore[operator]
    path.write_text(json.dumps(document))
    with pytest.raises(CheckpointError, match=message):
        Checkpoint(path).load()


def test_a_torn_checkpoint_is_refused_and_the_preparer_starts_empty(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "checkpoint.json"
    Checkpoint(path).save(CLAIMS)
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(CheckpointError, match="not JSON"):
        Checkpoint(path).load()
    preparer = _preparer(tmp_path, BOOT)
    with caplog.at_level(logging.ERROR):
        asyncio.run(preparer.load())
    assert preparer.prepared == {}
    assert "dra.checkpoint.unusable" in caplog.text


def test_a_prepare_cut_short_is_rolled_back_at_start_up_and_the_others_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cut_short = replace(CLAIMS["uid-1"], state=STARTED)
    Checkpoint(tmp_path / "checkpoint.json", BOOT).save({**CLAIMS, "uid-1": cut_short})
    specs = _specs(tmp_path, ["uid-1", "uid-3"])
    preparer = _preparer(tmp_path, BOOT)
    with caplog.at_level(logging.INFO):
        asyncio.run(preparer.load())
    assert not specs[0].exists() and specs[1].exists()
    kept = {uid: CLAIMS[uid] for uid in ("uid-2", "uid-3")}
    assert preparer.prepared == kept
    assert Checkpoint(tmp_path / "checkpoint.json").load() == Saved(BOOT, kept)
    assert _fields(caplog, "dra.claim.rolled_back") == [{"claim": "team-a/pair", "uid": "uid-1"}]


def test_an_earlier_boots_claims_are_dropped_at_start_up_with_a_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    Checkpoint(tmp_path / "checkpoint.json", "earlier-boot").save(CLAIMS)
    specs = _specs(tmp_path, ["uid-1", "uid-3"])
    preparer = _preparer(tmp_path, BOOT)
    with caplog.at_level(logging.WARNING):
        asyncio.run(preparer.load())
    assert preparer.prepared == {}
    assert not any(spec.exists() for spec in specs)
    assert Checkpoint(tmp_path / "checkpoint.json").load() == Saved(BOOT, {})
    assert _fields(caplog, "dra.checkpoint.earlier_boot") == [
        {"saved_boot_id": "earlier-boot", "boot_id": BOOT, "dropped": len(CLAIMS)}
    ]


def test_a_spec_that_cannot_be_removed_keeps_its_claim_to_roll_back_at_the_next_start(
    tmp_path: Path,
) -> None:
    Checkpoint(tmp_path / "checkpoint.json", "earlier-boot").save({"uid-1": CLAIMS["uid-1"]})
    stuck = tmp_path / "cdi" / spec_file_name("gpu.nvidia.com", "uid-1")
    stuck.mkdir(parents=True)  # unlink fails: EISDIR
    preparer = _preparer(tmp_path, BOOT)
    asyncio.run(preparer.load())
    assert preparer.prepared == {}
    saved = Checkpoint(tmp_path / "checkpoint.json").load()
    assert saved == Saved(BOOT, {"uid-1": replace(CLAIMS["uid-1"], state=STARTED)})


def test_the_boot_id_is_read_from_the_kernel_or_empty_when_it_cannot_be(tmp_path: Path) -> None:
    (tmp_path / "boot_id").write_text(BOOT + "\n")
    assert read_boot_id(tmp_path / "boot_id") == BOOT
    assert read_boot_id(tmp_path / "missing") == ""
    assert len(read_boot_id()) == len(BOOT)  # this machine's


def _fields(caplog: pytest.LogCaptureFixture, event: str) -> list[dict[str, Any]]:
    return [getattr(r, FIELDS) for r in caplog.records if r.getMessage() == event]


def _preparer(root: Path, boot_id: str) -> Preparer:
    devices = NodeDevices({}, HostScan(), CdiOptions())
    checkpoint = Checkpoint(root / "checkpoint.json", boot_id)
    return Preparer(_NoApi(), checkpoint, root / "cdi", "gpu.nvidia.com", "node-1", devices)


def _specs(root: Path, uids: list[str]) -> list[Path]:
    """A CDI spec file for each claim, as Prepare leaves it."""
    (root / "cdi").mkdir(exist_ok=True)
    paths = [root / "cdi" / spec_file_name("gpu.nvidia.com", uid) for uid in uids]
    for path in paths:
        path.write_text("{}")
    return paths


class _NoApi:
    async def read_claim(self, namespace: str, name: str) -> dict[str, object]:
        raise AssertionError("not called")
