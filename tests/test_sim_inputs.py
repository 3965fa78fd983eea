"""Hostile node and event files, read by both simulators: the Python one (`sim/node.py`,
`sim/events.py`) and the C library (`native/`), the latter built with AddressSanitizer and
UBSan (tests/native/simlib_inputs.c). Event lines: one table of cases
(tests/data/event-lines.json) that both must judge alike. Node files: `sim-root` refuses,
naming the field, whatever the library would refuse, and the library refuses a rendering
that breaks its rules instead of corrupting memory. MIG state files: the library takes every
layout it wrote itself and refuses the broken ones of the fuzzing corpus."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from simnode import gpu, migs

from deviceplugin.model.errors import ConfigError
from deviceplugin.sim.events import is_blank, parse_line
from deviceplugin.sim.libbuild import sanitized_program
from deviceplugin.sim.node import parse_node, read_node, resolve_node_path
from deviceplugin.sim.nodejson import render

REPO = Path(__file__).resolve().parent.parent
TABLE = REPO / "tests" / "data" / "event-lines.json"
HARNESS = REPO / "tests" / "native" / "simlib_inputs.c"
MIG_STATE_NODE = REPO / "tests" / "native" / "fuzz_mig_state_node.json"
MIG_STATES = REPO / "tests" / "data" / "fuzz" / "mig-state"


def table() -> list[tuple[bytes, str, str]]:
    cases = json.loads(TABLE.read_text())["cases"]
    return [
        (bytes.fromhex(c["hex"]) if "hex" in c else c["line"].encode(), c["verdict"], c["why"])
        for c in cases
    ]


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sanitized_program(HARNESS, tmp_path_factory.mktemp("inputs") / "simlib_inputs")


def python_verdict(raw: bytes) -> str:
    if is_blank(raw):
        return "blank"
    try:
        parse_line(raw)
    except ValueError:
        return "refused"
    return "ok"


def c_verdicts(harness: Path, lines: list[bytes]) -> list[str]:
    done = subprocess.run(
        [str(harness), "events"],
        input="".join(raw.hex() + "\n" for raw in lines),
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout.split()


# --- event lines ----------------------------------------------------------------------------


def test_python_judges_every_table_case_as_the_table_says() -> None:
    wrong = [(why, verdict) for raw, verdict, why in table() if python_verdict(raw) != verdict]
    assert wrong == []


def test_c_judges_every_table_case_as_the_table_says(harness: Path) -> None:
    cases = table()
    verdicts = c_verdicts(harness, [raw for raw, _, _ in cases])
    wrong = [(why, want, got) for (_, want, why), got in zip(cases, verdicts, strict=True)]
    assert [case for case in wrong if case[1] != case[2]] == []


def test_the_table_covers_what_the_readers_disagreed_on() -> None:
    whys = " ".join(why for _, _, why in table())
    for subject in ("duplicate key", "NUL", "surrogate", "past 32 bits", "not UTF-8", "NaN"):
        assert subject in whys


# --- node renderings the C library must refuse ------------------------------------------------


def rendering(preset: str = "a100-80gb-x8-mixed") -> dict[str, Any]:
    document: dict[str, Any] = json.loads(render(read_node(resolve_node_path(preset))))
    return document


def c_node(harness: Path, tmp_path: Path, document: object) -> str:
    path = tmp_path / "node.json"
    path.write_text(json.dumps(document))
    done = subprocess.run(
        [str(harness), "node", str(path)], capture_output=True, text=True, check=False, timeout=60
    )
    assert done.returncode in (0, 3), done.stderr[-4000:]
    return done.stdout.strip()


def _same_index_empty_uuid(doc: dict[str, Any]) -> None:
    doc["gpus"][1].update(index=0, uuid="")
    doc["gpus"][1]["nvlinks"] = doc["gpus"][0]["nvlinks"] * 2


def _repeated_profile(doc: dict[str, Any]) -> None:
    doc["gpus"][0]["giProfiles"] = [doc["gpus"][0]["giProfiles"][0]] * 17


def _eight_one_slice_instances(doc: dict[str, Any]) -> None:
    gpu0 = doc["gpus"][0]
    first = next(m for m in gpu0["migDevices"] if m["giSlices"] == 1)
    gpu0["migDevices"] = [
        {**first, "uuid": f"MIG-x{i}", "gpuInstanceId": i + 1, "placement": [i % 7, 1]}
        for i in range(8)
    ]


def _compute_instances_overfill(doc: dict[str, Any]) -> None:
    gpu0 = doc["gpus"][0]
    first = next(m for m in gpu0["migDevices"] if m["giSlices"] == 1)
    gpu0["migDevices"] = [
        {**first, "uuid": f"MIG-x{i}", "gpuInstanceId": 1, "computeInstanceId": i} for i in range(3)
    ]


def _too_many_links(doc: dict[str, Any]) -> None:
    doc["gpus"][0]["nvlinks"] = [{"remotePciBusId": "00000000:C0:00.0", "toSwitch": True}] * 37


def _too_many_gpus(doc: dict[str, Any]) -> None:
    doc["gpus"] = [copy.deepcopy(doc["gpus"][0]) for _ in range(65)]


def _placement_past_the_gpu(doc: dict[str, Any]) -> None:
    doc["gpus"][0]["giProfiles"][0]["placements"][0] = [7, 2]


def _duplicate_key(doc: dict[str, Any]) -> str:
    return json.dumps(doc).replace('"format": 1', '"format": 1, "format": 1', 1)


@pytest.mark.parametrize(
    "break_it",
    [
        _same_index_empty_uuid,
        _repeated_profile,
        _eight_one_slice_instances,
        _compute_instances_overfill,
        _too_many_links,
        _too_many_gpus,
        _placement_past_the_gpu,
    ],
)
def test_the_library_refuses_a_broken_rendering(
    break_it: Any, harness: Path, tmp_path: Path
) -> None:
    document = rendering()
    break_it(document)
    assert c_node(harness, tmp_path, document).startswith("refused: ")


def test_the_library_refuses_duplicate_keys(harness: Path, tmp_path: Path) -> None:
    path = tmp_path / "node.json"
    path.write_text(_duplicate_key(rendering()))
    done = subprocess.run([str(harness), "node", str(path)], capture_output=True, text=True)
    assert done.stdout.startswith("refused: ") and "duplicate" in done.stdout


@pytest.mark.parametrize("preset", ["a100-80gb-x8-mixed", "a30-x4-mig", "dgx1-hybrid-cube"])
def test_the_library_takes_every_preset(preset: str, harness: Path, tmp_path: Path) -> None:
    assert c_node(harness, tmp_path, rendering(preset)) == "ok"


# --- MIG state files: those the library wrote are taken, the broken ones refused ----------------


@pytest.mark.parametrize("state", sorted(p.name for p in MIG_STATES.iterdir()))
def test_the_library_judges_each_mig_state_of_the_corpus(state: str, harness: Path) -> None:
    done = subprocess.run(
        [str(harness), "state", str(MIG_STATE_NODE), str(MIG_STATES / state)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    verdict = "refused" if state.startswith("broken_") else "ok"
    assert done.stdout.split(":")[0].strip() == verdict, done.stdout + done.stderr


# --- node files sim-root must refuse, naming the field ------------------------------------------


def one_slice_migs(count: int, profile: str = "1g.10gb") -> dict[str, Any]:
    return migs(0, *[profile] * count)


def shared_instance(count: int) -> dict[str, Any]:
    fields = migs(0, *["1c.3g.40gb"] * count)
    for n, device in enumerate(fields["migDevices"]):
        device.update(gpuInstanceId=1, computeInstanceId=n)
    return fields


REFUSED: list[tuple[str, dict[str, Any], str]] = [
    ("eight 1g.10gb on one A100", {"gpus": [gpu(0, **one_slice_migs(8))]}, "gpus[0].migDevices"),
    (
        "four compute instances in a 3-slice GPU instance",
        {"gpus": [gpu(0, **shared_instance(4))]},
        "gpus[0].migDevices[3].profile",
    ),
    ("65 GPUs", {"gpus": [gpu(i) for i in range(65)]}, "gpus"),
    ("37 NVLinks", {"gpus": [gpu(0, nvlinkPeers=[1] * 37), gpu(1)]}, "gpus[0].nvlinkPeers"),
    (
        "NVLinks and switch links past 36",
        {"gpus": [gpu(0, nvlinkPeers=[1] * 20, nvswitchLinks=17), gpu(1)]},
        "gpus[0].nvswitchLinks",
    ),
    ("a 96-byte name", {"gpus": [gpu(0, name="N" * 96)]}, "gpus[0].name"),
    (
        "a MIG name past 95 bytes",
        {"gpus": [gpu(0, name="N" * 88, **migs(0, "1g.10gb"))]},
        "gpus[0].migDevices[0].profile",
    ),
    ("a 96-byte UUID", {"gpus": [gpu(0, uuid="GPU-" + "a" * 92)]}, "gpus[0].uuid"),
    ("an empty UUID", {"gpus": [gpu(0, uuid="GPU-")]}, "gpus[0].uuid"),
    ("a UUID with a blank", {"gpus": [gpu(0, uuid="GPU-a b")]}, "gpus[0].uuid"),
    ("a huge minor", {"gpus": [gpu(0, minor=2**70)]}, "gpus[0].minor"),
    ("minor 255, the control node's", {"gpus": [gpu(0, minor=255)]}, "gpus[0].minor"),
    ("two GPUs, one minor", {"gpus": [gpu(0, minor=3), gpu(1, minor=3)]}, "gpus[1].minor"),
    ("two GPUs, one index", {"gpus": [gpu(0, index=0), gpu(1, index=0, minor=1)]}, "gpus"),
    ("memory past 2^40 MiB", {"gpus": [gpu(0, memoryMiB=2**41)]}, "gpus[0].memoryMiB"),
    ("a NUMA node past 4096", {"gpus": [gpu(0, numaNode=5000)]}, "gpus[0].numaNode"),
    ("a negative NUMA node", {"gpus": [gpu(0, numaNode=-2)]}, "gpus[0].numaNode"),
    ("events past 63 bits", {"gpus": [gpu(0, supportedEvents=2**64)]}, "gpus[0].supportedEvents"),
    (
        "compute capability 100.0",
        {"gpus": [gpu(0, computeCapability="100.0")]},
        "gpus[0].computeCapability",
    ),
    ("CUDA version past 2^31-1", {"cudaDriverVersion": 2**31, "gpus": []}, "cudaDriverVersion"),
    ("a driver version that leaves DIR", {"driverVersion": "../../x", "gpus": []}, "driverVersion"),
    (
        "GPU instance id 15",
        {"gpus": [gpu(0, **migs(0, "1g.10gb"))]},
        "gpus[0].migDevices[0].gpuInstanceId",
    ),
    ("a bus id with blanks", {"gpus": [gpu(0, pciBusId=" 0: 1: 0.0")]}, "gpus[0].pciBusId"),
    (
        "a function name past 120",
        {"gpus": [gpu(0, notSupported=["nvml" + "x" * 121])]},
        "gpus[0].notSupported[0]",
    ),
]
REFUSED[21][1]["gpus"][0]["migDevices"][0]["gpuInstanceId"] = 15


@pytest.mark.parametrize(
    ("document", "field"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED]
)
def test_the_schema_refuses_naming_the_field(document: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_node(document)
    assert caught.value.path == field


def test_several_compute_instances_share_one_gpu_instance() -> None:
    node = parse_node({"gpus": [gpu(0, **shared_instance(3))]})
    assert {mig.placement for mig in node.gpus[0].mig_devices} == {(0, 4)}


def test_seven_one_slice_instances_fill_an_a100() -> None:
    node = parse_node({"gpus": [gpu(0, **one_slice_migs(7))]})
    assert sorted(mig.placement[0] for mig in node.gpus[0].mig_devices) == list(range(7))


def sim_root(node: Path, directory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "deviceplugin", "sim-root", str(node), str(directory)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def test_sim_root_refuses_with_exit_2_and_the_field(tmp_path: Path) -> None:
    node = tmp_path / "node.yaml"
    node.write_text(yaml.safe_dump({"gpus": [gpu(0, **one_slice_migs(8))]}))
    done = sim_root(node, tmp_path / "root")
    assert done.returncode == 2, done.stderr
    assert "gpus[0].migDevices" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"gpus:\n- uuid: GPU-\xff\n", "not UTF-8"),
        (b"gpus:\n- {uuid: GPU-1, name: X, memoryMiB: 1, minor: 99999999999999999999}\n", "minor"),
    ],
)
def test_sim_root_gives_no_traceback(tmp_path: Path, content: bytes, words: str) -> None:
    node = tmp_path / "node.yaml"
    node.write_bytes(content)
    done = sim_root(node, tmp_path / "root")
    assert done.returncode == 2
    assert words in done.stderr and "Traceback" not in done.stderr


def test_an_alias_bomb_is_refused_at_once(tmp_path: Path) -> None:
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    node = tmp_path / "bomb.yaml"
    node.write_text("\n".join(lines) + "\ngpus: [*a8]\n")
    assert node.stat().st_size < 1000
    started = time.monotonic()
    with pytest.raises(ConfigError, match="expands to more than"):
        read_node(node)
    assert time.monotonic() - started < 10


@pytest.mark.parametrize("kind", ["fifo", "directory", "device"])
def test_a_node_file_that_is_no_regular_file_is_refused_without_blocking(
    tmp_path: Path, kind: str
) -> None:
    path = tmp_path / "node.yaml"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        path = Path("/dev/zero")
    with pytest.raises(ConfigError, match="not a regular file"):
        read_node(resolve_node_path(str(path)))


def test_a_node_file_past_1_mib_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text("# " + "x" * (1 << 20) + "\ngpus: []\n")
    with pytest.raises(ConfigError, match="limit"):
        read_node(path)
