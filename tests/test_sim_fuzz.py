"""libFuzzer over the simulated library's parsers (tests/native/fuzz_inputs.c), for a fixed
short time each, from the committed corpus (tests/data/fuzz/): the node rendering, which a
node accepted is then served through the instance listings, the event line, and the MIG state
file laid over a fixed node and served the same way. Built with
clang under AddressSanitizer and UBSan; clang is installed from Debian when missing
(`e2e/host-packages.sh fuzz`), and only where it cannot be is the test skipped, saying why."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from test_sim_inputs import table

from deviceplugin.sim.libbuild import fuzz_target
from deviceplugin.sim.node import read_node
from deviceplugin.sim.nodejson import render

REPO = Path(__file__).resolve().parent.parent
TARGET = REPO / "tests" / "native" / "fuzz_inputs.c"
CORPUS = REPO / "tests" / "data" / "fuzz"
SECONDS = 20
# The node the MIG state target lays each input over (fuzz_inputs.c), rendered beside it.
MIG_STATE_NODE = REPO / "tests" / "native" / "fuzz_mig_state_node.json"
MIG_STATE_NODE_YAML = """\
driverVersion: "550.90.07"
cudaDriverVersion: 12040
gpus:
  - uuid: GPU-a0000000-0000-4000-8000-000000000000
    name: NVIDIA A100-SXM4-80GB
    memoryMiB: 81920
    pciBusId: "00000000:07:00.0"
    computeCapability: "8.0"
    migCapable: true
    migEnabled: true
    migDevices:
      - profile: 2c.3g.40gb
        uuid: MIG-a0000000-0001-4000-8000-000000000000
        gpuInstanceId: 1
        computeInstanceId: 0
      - profile: 1c.3g.40gb
        uuid: MIG-a0000000-0002-4000-8000-000000000000
        gpuInstanceId: 1
        computeInstanceId: 1
      - profile: 1g.10gb
        uuid: MIG-a0000000-0003-4000-8000-000000000000
        gpuInstanceId: 9
        computeInstanceId: 0
  - uuid: GPU-b0000000-0000-4000-8000-000000000000
    name: NVIDIA H100 80GB HBM3
    memoryMiB: 81559
    pciBusId: "00000000:0F:00.0"
    computeCapability: "9.0"
    migCapable: true
"""
PARSERS = {
    "node": ("-DFUZZ_NODE", 1 << 16),
    "events": ("-DFUZZ_EVENTS", 8192),
    "mig-state": ("-DFUZZ_MIG_STATE", 1 << 16),
}


def clang_or_skip() -> None:
    if shutil.which("clang"):
        return
    done = subprocess.run(
        [str(REPO / "e2e" / "host-packages.sh"), "fuzz"],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    if done.returncode != 0 or not shutil.which("clang"):
        pytest.skip(f"no clang for libFuzzer, and it cannot be installed: {done.stderr.strip()}")


@pytest.mark.parametrize("parser", sorted(PARSERS))
def test_the_parser_survives_fuzzing(parser: str, tmp_path: Path) -> None:
    clang_or_skip()
    define, longest = PARSERS[parser]
    program = fuzz_target(TARGET, tmp_path / f"fuzz_{parser}", define)
    found = tmp_path / "corpus"
    found.mkdir()
    done = subprocess.run(
        [
            str(program),
            f"-max_total_time={SECONDS}",
            f"-max_len={longest}",
            "-timeout=10",
            "-rss_limit_mb=2048",
            f"-artifact_prefix={tmp_path}/",
            str(found),
            str(CORPUS / parser),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=SECONDS + 120,
    )
    assert done.returncode == 0, done.stderr[-6000:]
    assert "runtime error" not in done.stderr, done.stderr[-6000:]


def test_the_corpus_holds_every_event_table_case() -> None:
    seeds = {path.read_bytes() for path in (CORPUS / "events").iterdir()}
    assert [why for raw, _, why in table() if raw not in seeds] == []


def test_the_mig_state_target_lays_states_over_the_current_rendering(tmp_path: Path) -> None:
    (tmp_path / "node.yaml").write_text(MIG_STATE_NODE_YAML)
    current = json.loads(render(read_node(tmp_path / "node.yaml")))
    assert json.loads(MIG_STATE_NODE.read_text()) == current


def test_the_corpus_holds_the_broken_nodes() -> None:
    names = {path.name for path in (CORPUS / "node").iterdir()}
    assert {"broken_repeated_profile.json", "broken_same_index_empty_uuid.json"} <= names
    assert any(name.startswith("preset-") for name in names)
