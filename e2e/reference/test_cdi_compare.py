"""Our CDI spec against `nvidia-ctk cdi generate` on simulated driver roots (cdicompare.py):
no difference that `DOCUMENTED` does not explain, and every documented one still seen, so a
difference that goes away is noticed and its entry (and docs/compatibility.md) updated.

Runs in `make e2e` (root); on its own: `.venv/bin/python -m pytest e2e/reference`. Needs root
(mknod, unshare, mount) and Go and gcc for build.sh; skips without them. The first tests check
the comparison itself on plain values and need neither.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from e2e.reference.cdicompare import (
    ABSENT,
    COMMON,
    DOCUMENTED,
    Outcome,
    compare,
    explain,
    nvidia_ctk,
    run_preset,
)

# MIG devices only; MIG and whole GPUs mixed; whole GPUs only (the per-GPU hooks).
PRESETS = ("a30-x4-mig", "a100-80gb-x8-mixed", "h100-x8")
ROOT = "/sim"


def spec(*devices: dict[str, Any], **common: Any) -> dict[str, Any]:
    return {"kind": "k/gpu", "cdiVersion": "0.5.0", "devices": list(devices), **common}


def gpu(name: str, *paths: str, **node: Any) -> dict[str, Any]:
    nodes = [{"path": p, "hostPath": ROOT + p, **node} for p in paths]
    return {"name": name, "containerEdits": {"deviceNodes": nodes}}


def test_host_paths_are_relative_to_the_root_and_an_omitted_minor_is_zero() -> None:
    ours = spec(gpu("0", "/dev/nvidia0", major=195, minor=0))
    theirs = spec(gpu("0", "/dev/nvidia0", major=195))
    outcome = compare(ours, theirs, ROOT)
    assert outcome.differences == []
    # kind, cdiVersion, the device, its node, the node's hostPath, major and minor
    assert outcome.agreed == 7


def test_each_difference_is_named_and_classified() -> None:
    mount = {"hostPath": "/dev/null", "containerPath": "/x", "options": ["ro"]}
    ours = spec(gpu("0", "/dev/nvidia0", type="c"), containerEdits={"env": ["A=1"]})
    theirs = spec(
        gpu("0", "/dev/nvidia0", permissions="rwm"),
        gpu("1", "/dev/nvidia1"),
        containerEdits={"env": ["A=2"], "mounts": [mount]},
    )
    differences = {(d.scope, d.field, d.key): d for d in compare(ours, theirs, ROOT).differences}
    assert set(differences) == {
        ("0", "deviceNode.type", "/dev/nvidia0"),
        ("0", "deviceNode.permissions", "/dev/nvidia0"),
        ("1", "device", "1"),
        (COMMON, "env.value", "A"),
        (COMMON, "mount", "/x"),
    }
    assert differences[("1", "device", "1")].ours == ABSENT
    explained = {key: doc.ident for key, d in differences.items() if (doc := explain(d))}
    assert explained == {
        ("0", "deviceNode.type", "/dev/nvidia0"): "node-type",
        ("0", "deviceNode.permissions", "/dev/nvidia0"): "node-permissions",
    }


def test_a_gpu_in_mig_mode_is_told_from_a_missing_gpu() -> None:
    caps = "/dev/nvidia-caps/nvidia-cap30"
    mig = gpu("0:0", "/dev/nvidia0", caps)
    ours = spec(gpu("0", "/dev/nvidia0"), mig, gpu("1", "/dev/nvidia1"))
    theirs = spec(mig)
    unexplained = compare(ours, theirs, ROOT).unexplained()
    assert [(d.field, d.key) for d in unexplained] == [("device", "1")]


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root: mknod, unshare and mount (run in make e2e)"
    for tool in ("go", "gcc", "unshare"):
        if shutil.which(tool) is None:
            return f"needs {tool} (build.sh builds nvidia-ctk with Go and gcc)"
    return None


@pytest.fixture(scope="module")
def outcomes() -> list[Outcome]:
    reason = _skip_reason()
    if reason is not None:
        pytest.skip(reason)
    ctk = nvidia_ctk()
    return [outcome for preset in PRESETS for outcome in run_preset(preset, ctk)]


def test_every_difference_from_nvidia_ctk_is_documented(outcomes: list[Outcome]) -> None:
    unexplained = [f"{o.preset} ({o.strategy}): {d}" for o in outcomes for d in o.unexplained()]
    assert unexplained == []
    assert all(o.agreed > 0 for o in outcomes)


def test_every_documented_difference_still_occurs(outcomes: list[Outcome]) -> None:
    seen = {doc.ident for o in outcomes for _, doc in o.explained()}
    assert [doc.ident for doc in DOCUMENTED if doc.ident not in seen] == []


def test_the_docs_give_every_documented_difference() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "compatibility.md").read_text()
    section = docs.split("## CDI: ours and nvidia-ctk", 1)[1].split("\n## ", 1)[0]
    assert [doc.ident for doc in DOCUMENTED if f"| `{doc.ident}` |" not in section] == []
