"""The checkpoint file: a round trip, atomic replacement with nothing left behind, and a file
that cannot be trusted (edited, torn, another version) detected rather than believed."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from deviceplugin.dra.checkpoint import (
    Checkpoint,
    CheckpointError,
    PreparedClaim,
    PreparedDevice,
)
from deviceplugin.dra.prepare import NodeDevices, Preparer
from deviceplugin.model.cdi import CdiOptions, HostScan

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
                ("gpu",), "node-1", "gpu-5", ("k/c=uid-3-gpu-5-s",), share_id="s", interval="Long"
            ),
            PreparedDevice(("mon",), "node-1", "gpu-6", ("k/c=uid-3-gpu-6",), admin_access=True),
        ),
    ),
}


def test_a_checkpoint_without_the_setup_keys_loads_with_their_defaults(tmp_path: Path) -> None:
    """A file written before devices recorded their setup: same version, same checksum rule."""
    path = tmp_path / "checkpoint.json"
    Checkpoint(path).save({"uid-1": CLAIMS["uid-1"]})
    document = json.loads(path.read_text())
    assert set(document["data"]["claims"]["uid-1"]["devices"][0]) == {
        "requests",
        "pool",
        "device",
        "cdiDeviceIDs",
    }
    assert Checkpoint(path).load() == {"uid-1": CLAIMS["uid-1"]}


def test_a_saved_checkpoint_loads_back_and_leaves_no_temp_file(tmp_path: Path) -> None:
    checkpoint = Checkpoint(tmp_path / "checkpoint.json")
    assert checkpoint.load() == {}
    checkpoint.save(CLAIMS)
    assert Checkpoint(tmp_path / "checkpoint.json").load() == CLAIMS
    checkpoint.save({"uid-2": CLAIMS["uid-2"]})
    assert checkpoint.load() == {"uid-2": CLAIMS["uid-2"]}
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.json"]


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        pytest.param(lambda d: d["data"]["claims"].pop("uid-2"), "checksum", id="edited"),
        pytest.param(lambda d: d.update(version=2), "version 2", id="version"),
        pytest.param(lambda d: d.pop("data"), "malformed", id="no-data"),
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
    with pytest.raises(CheckpointError, match="malformed"):
        Checkpoint(path).load()
    devices = NodeDevices({}, HostScan(), CdiOptions())
    preparer = Preparer(_NoApi(), Checkpoint(path), tmp_path, "gpu.nvidia.com", "node-1", devices)
    with caplog.at_level(logging.ERROR):
        preparer.load()
    assert preparer.prepared == {}
    assert "dra.checkpoint.unusable" in caplog.text


class _NoApi:
    async def read_claim(self, namespace: str, name: str) -> dict[str, object]:
        raise AssertionError("not called")
