"""Properties of the simulators' readers over generated input (Hypothesis): the node reader
either returns a Node or raises ConfigError naming a field, whatever the document or bytes; a
node it accepts is one the C library accepts too (so `sim-root` never writes a node its
library refuses at nvmlInit); the event reader either parses a line or raises ValueError, and
the events file hands each complete line over once, however the appends are split."""

from __future__ import annotations

import contextlib
import json
import logging
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from simnode import gpu_uuid, mig_uuid

from deviceplugin.model.errors import ConfigError
from deviceplugin.sim.events import EventFile, parse_line
from deviceplugin.sim.libbuild import sanitized_program
from deviceplugin.sim.node import parse_node, read_node
from deviceplugin.sim.nodejson import render

HARNESS = Path(__file__).parent / "native" / "simlib_inputs.c"
PROPERTY = settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
PROFILES = ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb", "1c.3g.40gb"]
MODELS = ["NVIDIA A100-SXM4-80GB", "NVIDIA A30", "NVIDIA H100 80GB HBM3", "NVIDIA Made-Up"]
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.text(max_size=20),
)
ACCEPTED: list[int] = []  # how many generated nodes the schema took: the property needs some
documents = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=20,
)


@st.composite
def nodes(draw: st.DrawFn) -> dict[str, Any]:
    """Node documents near the valid ones: real models and profiles, ids and counts that may
    clash or overflow."""
    count = draw(st.integers(min_value=1, max_value=4))
    gpus = []
    for index in range(count):
        devices = [
            {
                "profile": draw(st.sampled_from(PROFILES)),
                "uuid": mig_uuid(index, n),
                "gpuInstanceId": draw(st.just(n + 1) | st.integers(min_value=0, max_value=15)),
                "computeInstanceId": draw(st.just(0) | st.integers(min_value=0, max_value=3)),
            }
            for n in range(draw(st.integers(min_value=0, max_value=3) | st.integers(0, 9)))
        ]
        gpus.append(
            {
                "uuid": gpu_uuid(index),
                "name": draw(st.sampled_from(MODELS)),
                "memoryMiB": draw(st.sampled_from([24258, 81920, 81559])),
                "pciBusId": f"00000000:{0x10 + index:02X}:00.0",
                "minor": draw(st.just(index) | st.integers(min_value=0, max_value=3)),
                "migEnabled": bool(devices),
                "migDevices": devices,
                "nvlinkPeers": [
                    peer
                    for peer in draw(st.lists(st.integers(0, count - 1), max_size=12))
                    if peer != index
                ],
                "nvswitchLinks": draw(st.integers(min_value=0, max_value=12) | st.integers(0, 40)),
            }
        )
    return {"gpus": gpus}


@PROPERTY
@given(document=documents)
def test_any_document_is_a_node_or_an_error_naming_a_field(document: object) -> None:
    with contextlib.suppress(ConfigError):
        parse_node(document)


@PROPERTY
@given(data=st.binary(max_size=300))
def test_any_bytes_are_a_node_or_an_error(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "node.yaml"
    path.write_bytes(data)
    with contextlib.suppress(ConfigError):
        read_node(path)


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sanitized_program(HARNESS, tmp_path_factory.mktemp("inputs") / "simlib_inputs")


@settings(PROPERTY, max_examples=60)
@given(document=nodes())
def test_a_node_the_schema_accepts_the_library_accepts(
    document: dict[str, Any], harness: Path, tmp_path: Path
) -> None:
    try:
        node = parse_node(document)
    except ConfigError:
        return
    ACCEPTED.append(len(node.gpus))
    path = tmp_path / "node.json"
    path.write_text(render(node))
    done = subprocess.run([str(harness), "node", str(path)], capture_output=True, text=True)
    assert done.stdout.strip() == "ok", (done.stdout, done.stderr[-3000:])


@PROPERTY
@given(line=st.binary(max_size=200) | st.text(max_size=100).map(str.encode))
def test_any_line_parses_or_is_refused(line: bytes) -> None:
    with contextlib.suppress(ValueError):
        parse_line(line)


@PROPERTY
@given(
    xids=st.lists(st.integers(min_value=0, max_value=999), max_size=20),
    cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=6),
)
def test_each_line_is_read_once_however_appends_are_split(
    tmp_path: Path, xids: list[int], cuts: list[int]
) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"")
    reader = EventFile(path)
    text = "".join(json.dumps({"uuid": gpu_uuid(0), "xid": xid}) + "\n" for xid in xids).encode()
    got: list[int | None] = []
    start = 0
    logging.disable(logging.WARNING)
    try:
        for cut in [*sorted(c % (len(text) + 1) for c in cuts), len(text)]:
            with open(path, "ab") as stream:
                stream.write(text[start:cut])
            start = max(start, cut)
            got += [event.xid for event in reader.read()]
    finally:
        logging.disable(logging.NOTSET)
        path.write_bytes(b"")
    assert got == xids


@pytest.mark.slow  # where the property runs with all its examples
def test_the_generated_nodes_include_accepted_ones() -> None:
    """Runs after the property (file order, one worker per module): it must have checked some
    accepted nodes."""
    assert len(ACCEPTED) >= 5, ACCEPTED
