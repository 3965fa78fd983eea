"""The simulator's event wait sleeps until the events file is written: prompt, idle-cheap, and
without leaking a descriptor; polling where the directory cannot be watched."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from harness import inotify_descriptors
from simnode import SimNode, gpu, gpu_uuid, python_only

from deviceplugin.sim import events as sim_events

pytestmark = pytest.mark.usefixtures("nvml_backend")


def _wait_for_append(node: SimNode, timeout_ms: int) -> tuple[object, float]:
    event_set, _ = node.nvml.event_set([gpu_uuid(0)])
    timer = threading.Timer(0.05, node.append, [{"uuid": gpu_uuid(0), "xid": 79}])
    timer.start()
    started = time.monotonic()
    event = event_set.wait(timeout_ms)
    latency = time.monotonic() - started - 0.05
    timer.join()
    event_set.close()
    return event, latency


def test_a_blocked_wait_wakes_on_the_appended_line(tmp_path: Path) -> None:
    event, latency = _wait_for_append(SimNode(tmp_path, [gpu(0)]), 5000)
    assert event is not None
    assert latency < 0.05


def test_an_idle_wait_costs_almost_no_cpu(tmp_path: Path) -> None:
    node = SimNode(tmp_path, [gpu(0)])
    event_set, _ = node.nvml.event_set([gpu_uuid(0)])
    cpu = time.thread_time()
    assert event_set.wait(300) is None
    assert time.thread_time() - cpu < 0.01
    event_set.close()


def test_freeing_the_last_set_closes_the_watch(tmp_path: Path) -> None:
    before = inotify_descriptors()
    node = SimNode(tmp_path, [gpu(0)])
    event_set, _ = node.nvml.event_set([gpu_uuid(0)])
    assert event_set.wait(1) is None
    assert inotify_descriptors() == before + 1
    event_set.close()
    assert inotify_descriptors() == before


def test_without_inotify_the_wait_polls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    python_only("inotify is stubbed in the simulator's Python module")

    def unavailable(directory: Path, mask: int) -> int:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(sim_events, "_inotify", unavailable)
    event, latency = _wait_for_append(SimNode(tmp_path, [gpu(0)]), 5000)
    assert event is not None
    assert latency < 0.05
