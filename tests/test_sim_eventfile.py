"""The events file as both simulators read it (Python's and the C library, through the same
Nvml adapter): every line once, whatever happens to the file. A file replaced by a rename
(editors, `sed -i`, logrotate) or truncated is read from its start; an over-long line is
skipped, never applied; a FIFO blocks nothing; a million lines nobody waits for leave memory
flat."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
from simnode import SimNode, gpu, gpu_uuid

from deviceplugin.sim.events import MAX_LINE

pytestmark = pytest.mark.usefixtures("nvml_backend")


def xid_line(xid: int) -> str:
    return json.dumps({"uuid": gpu_uuid(0), "xid": xid}) + "\n"


def xids(node: SimNode, events: object, want: int) -> list[int]:
    """The Xids of up to `want` events, stopping at the first wait that times out."""
    got: list[int] = []
    while len(got) < want:
        event = events.wait(1000)  # type: ignore[attr-defined]
        if event is None:
            break
        got.append(event.xid)
    return got


def test_a_file_replaced_by_a_rename_is_read_from_its_start(tmp_path: Path) -> None:
    node = SimNode(tmp_path, [gpu(0)])
    events, _ = node.nvml.event_set([gpu_uuid(0)])
    node.events_path.write_text("".join(xid_line(100 + n) for n in range(20)))
    assert xids(node, events, 20) == list(range(100, 120))
    replacement = node.events_path.with_name("events.new")
    replacement.write_text("".join(xid_line(200 + n) for n in range(30)))
    os.replace(replacement, node.events_path)
    assert xids(node, events, 31) == list(range(200, 230))
    events.close()


def test_a_truncated_file_is_read_from_its_start(tmp_path: Path) -> None:
    node = SimNode(tmp_path, [gpu(0)])
    events, _ = node.nvml.event_set([gpu_uuid(0)])
    node.append(*(json.loads(xid_line(n)) for n in range(5)))
    assert xids(node, events, 5) == list(range(5))
    node.events_path.write_text(xid_line(42))
    assert xids(node, events, 2) == [42]
    events.close()


def test_an_over_long_line_is_skipped_not_applied(tmp_path: Path) -> None:
    node = SimNode(tmp_path, [gpu(0)])
    events, _ = node.nvml.event_set([gpu_uuid(0)])
    applied_if_cut = xid_line(13).rstrip("\n") + " " * (MAX_LINE + 100) + "\n"
    with open(node.events_path, "a") as stream:
        stream.write(applied_if_cut + "x" * 3 * MAX_LINE + "\n" + xid_line(48))
    assert xids(node, events, 2) == [48]
    events.close()


def test_a_fifo_for_events_blocks_no_call(tmp_path: Path) -> None:
    node = SimNode(tmp_path, [gpu(0)])
    node.events_path.unlink(missing_ok=True)
    os.mkfifo(node.events_path)
    done = threading.Event()

    def count() -> None:
        node.sim.nvmlDeviceGetCount()
        done.set()

    threading.Thread(target=count, daemon=True).start()
    assert done.wait(5), "an NVML call blocked on a FIFO"


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.mark.slow
def test_a_million_lines_nobody_waits_for_leave_memory_flat(tmp_path: Path) -> None:
    node = SimNode(tmp_path, [gpu(0)])
    events, _ = node.nvml.event_set([gpu_uuid(0)])
    block = "".join(xid_line(n % 1000) for n in range(100_000))
    node.sim.nvmlDeviceGetCount()
    before = rss_kib()
    started = time.monotonic()
    for _ in range(10):
        with open(node.events_path, "a") as stream:
            stream.write(block)
        for _ in range(10):  # a call reads what was appended (Python: 1 MiB of it at most)
            node.sim.nvmlDeviceGetCount()
    grown = rss_kib() - before
    assert grown < 24 * 1024, f"{grown} KiB more after a million queued events"
    assert time.monotonic() - started < 120
    assert events.wait(0) is not None  # it still holds the first ones
    events.close()
