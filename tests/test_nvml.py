"""The NVML adapter on the simulator: error translation, event registration and waits, probes."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest
from simnode import SimNode, gpu, gpu_uuid, mig_uuid, migs

from deviceplugin.model.errors import ConfigError, GpuLostError, NvmlError
from deviceplugin.node.nvml import (
    EVENT_DOUBLE_BIT_ECC,
    EVENT_XID,
    UNMONITORED,
    EventSet,
    Nvml,
    NvmlEvent,
    Probe,
)
from deviceplugin.runtime.host import open_nvml
from deviceplugin.sim.simulator import NodeSimulator

pytestmark = pytest.mark.usefixtures("nvml_backend")


@pytest.fixture
def node(tmp_path: Path) -> SimNode:
    return SimNode(tmp_path, [gpu(0, **migs(0, "1g.10gb", "2g.20gb")), gpu(1), gpu(2)])


@pytest.fixture
def events(node: SimNode) -> EventSet:
    event_set, failed = node.nvml.event_set([gpu_uuid(i) for i in range(3)])
    assert failed == {}
    return event_set


# --- errors -------------------------------------------------------------------------------------


def _raising(error: Exception) -> Any:
    def call(*_args: Any) -> Any:
        raise error

    return call


@pytest.mark.parametrize("module_errors", ["pynvml", "sim"])
def test_errors_translate_by_code(node: SimNode, module_errors: str) -> None:
    """The same code gives the same error whether pynvml or the simulator raised it."""
    errors = pynvml if module_errors == "pynvml" else node.sim
    module = SimpleNamespace(
        NVMLError=errors.NVMLError,
        nvmlInit=_raising(errors.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)),
        nvmlDeviceGetCount=_raising(errors.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)),
    )
    nvml = Nvml(module)
    with pytest.raises(GpuLostError) as lost:
        nvml.init()
    assert lost.value.code == 15
    with pytest.raises(NvmlError) as failed:
        nvml.gpu_count()
    assert failed.value.code == 9
    assert not isinstance(failed.value, GpuLostError)
    assert "counting GPUs" in str(failed.value)


def test_calls_before_init_fail(tmp_path: Path) -> None:
    nvml = open_nvml(NodeSimulator(str(SimNode(tmp_path, [gpu(0)]).node_path)))
    with pytest.raises(NvmlError) as caught:
        nvml.gpu_count()
    assert caught.value.code == 1


def test_lost_gpu_raises_gpu_lost(node: SimNode) -> None:
    node.append({"uuid": gpu_uuid(1), "lost": True})
    with pytest.raises(GpuLostError, match="GPU 1"):
        node.nvml.gpu(1)
    assert node.nvml.gpu(2).uuid == gpu_uuid(2)


def test_open_nvml_choices(tmp_path: Path) -> None:
    assert open_nvml(None).module is pynvml
    with pytest.raises(ConfigError):
        open_nvml(None, str(tmp_path / "events.jsonl"))
    with pytest.raises(ConfigError, match="a10-x8"):
        open_nvml(NodeSimulator("no-such-preset"))
    simulated = open_nvml(NodeSimulator("a10-x8"))
    assert simulated.numa_reader is not None


# --- events -------------------------------------------------------------------------------------


def test_wait_times_out_with_none(events: EventSet) -> None:
    started = time.monotonic()
    assert events.wait(50) is None
    assert 0.045 <= time.monotonic() - started < 5  # waited, and did not block


def test_xid_on_gpu(node: SimNode, events: EventSet) -> None:
    node.append({"uuid": gpu_uuid(1), "xid": 79})
    assert events.wait(1000) == NvmlEvent(gpu_uuid(1), EVENT_XID, 79, None, None)
    assert events.wait(0) is None


def test_xid_on_mig_device_arrives_on_parent_with_instance_ids(
    node: SimNode, events: EventSet
) -> None:
    node.append({"uuid": mig_uuid(0, 1), "xid": 94})
    assert events.wait(1000) == NvmlEvent(gpu_uuid(0), EVENT_XID, 94, 2, 0)


def test_ecc_event(node: SimNode, events: EventSet) -> None:
    node.append({"uuid": gpu_uuid(2), "ecc": "double"})
    assert events.wait(1000) == NvmlEvent(gpu_uuid(2), EVENT_DOUBLE_BIT_ECC, 0, None, None)


def test_lost_then_recovered(node: SimNode, events: EventSet) -> None:
    node.append({"uuid": gpu_uuid(1), "lost": True})
    assert events.wait(1000) == NvmlEvent(gpu_uuid(1), EVENT_XID, 79, None, None)
    assert node.nvml.probe(gpu_uuid(1)) == Probe(answers=False, lost=True)
    node.append({"uuid": gpu_uuid(1), "lost": False})
    assert node.nvml.probe(gpu_uuid(1)) == Probe(answers=True, lost=False, recovery_action=0)
    assert events.wait(0) is None


def test_lost_with_its_own_xid(node: SimNode, events: EventSet) -> None:
    node.append({"uuid": gpu_uuid(2), "lost": True, "xid": 154})
    assert events.wait(1000) == NvmlEvent(gpu_uuid(2), EVENT_XID, 154, None, None)
    assert events.wait(0) is None


def _complaints(node: SimNode, caplog: pytest.LogCaptureFixture, capfd: Any) -> list[str]:
    """What the backend said about event lines: the simulator's log events, the C library's
    stderr lines."""
    if node.backend == "c":
        return capfd.readouterr().err.splitlines()
    return caplog.messages


def test_malformed_lines_are_skipped(
    node: SimNode, events: EventSet, caplog: pytest.LogCaptureFixture, capfd: Any
) -> None:
    node.append(
        "not json",
        "[1, 2]",
        {"uuid": gpu_uuid(0), "xid": "79"},
        {"uuid": gpu_uuid(0), "xdi": 79},
        {"xid": 79},
        {"uuid": gpu_uuid(0), "xid": 13},
    )
    with caplog.at_level(logging.WARNING):
        assert events.wait(1000) == NvmlEvent(gpu_uuid(0), EVENT_XID, 13, None, None)
    said = _complaints(node, caplog, capfd)
    assert sum("sim.event.malformed" in s or "skipped an event line" in s for s in said) == 5


def test_unknown_device_is_skipped(
    node: SimNode, events: EventSet, caplog: pytest.LogCaptureFixture, capfd: Any
) -> None:
    node.append({"uuid": gpu_uuid(9), "xid": 79}, {"uuid": gpu_uuid(0), "xid": 31})
    with caplog.at_level(logging.WARNING):
        assert events.wait(1000) == NvmlEvent(gpu_uuid(0), EVENT_XID, 31, None, None)
    said = _complaints(node, caplog, capfd)
    assert any("sim.event.unknown_device" in s or "names no GPU" in s for s in said)


@pytest.mark.parametrize(
    ("value", "error", "code"),
    [
        pytest.param("unknown", NvmlError, 999, id="unknown"),
        pytest.param("gpuIsLost", GpuLostError, 15, id="gpu-is-lost"),
        pytest.param(3, NvmlError, 3, id="by-code"),
    ],
)
def test_wait_error(
    node: SimNode, events: EventSet, value: object, error: type[NvmlError], code: int
) -> None:
    node.append({"waitError": value})
    with pytest.raises(error) as caught:
        events.wait(1000)
    assert caught.value.code == code
    assert events.wait(0) is None  # only the next wait fails


def test_event_set_recreated_after_error(node: SimNode, events: EventSet) -> None:
    node.append({"waitError": "unknown"})
    with pytest.raises(NvmlError):
        events.wait(1000)
    events.close()
    fresh, _ = node.nvml.event_set([gpu_uuid(0)])
    node.append({"uuid": gpu_uuid(0), "xid": 48})
    assert fresh.wait(1000) == NvmlEvent(gpu_uuid(0), EVENT_XID, 48, None, None)
    with pytest.raises(NvmlError):
        events.wait(0)  # a closed set


def test_event_only_for_registered_gpus(node: SimNode) -> None:
    only_zero, _ = node.nvml.event_set([gpu_uuid(0), gpu_uuid(0)])
    node.append({"uuid": gpu_uuid(1), "xid": 79}, {"uuid": gpu_uuid(0), "xid": 62})
    assert only_zero.wait(1000) == NvmlEvent(gpu_uuid(0), EVENT_XID, 62, None, None)
    assert only_zero.wait(0) is None


def test_appended_line_is_delivered_promptly(node: SimNode, events: EventSet) -> None:
    timer = threading.Timer(0.1, node.append, [{"uuid": gpu_uuid(0), "xid": 79}])
    timer.start()
    started = time.monotonic()
    event = events.wait(5000)
    latency = time.monotonic() - started - 0.1
    timer.join()
    assert event is not None and event.xid == 79
    assert latency < 0.1


def test_idle_wait_uses_little_cpu(events: EventSet) -> None:
    cpu = time.process_time()
    assert events.wait(500) is None
    assert time.process_time() - cpu < 0.1


def test_partial_line_waits_for_its_newline(node: SimNode, events: EventSet) -> None:
    with open(node.events_path, "a") as stream:
        stream.write(f'{{"uuid": "{gpu_uuid(0)}", ')
    assert events.wait(30) is None
    with open(node.events_path, "a") as stream:
        stream.write('"xid": 79}\n')
    assert events.wait(1000) == NvmlEvent(gpu_uuid(0), EVENT_XID, 79, None, None)


def test_lines_written_before_start_are_not_replayed(tmp_path: Path) -> None:
    (tmp_path / "events.jsonl").write_text(f'{{"uuid": "{gpu_uuid(0)}", "xid": 79}}\n')
    node = SimNode(tmp_path, [gpu(0)])
    event_set, _ = node.nvml.event_set([gpu_uuid(0)])
    assert event_set.wait(30) is None


def test_truncated_file_is_read_from_start(node: SimNode, events: EventSet) -> None:
    node.append({"uuid": gpu_uuid(0), "xid": 79}, {"uuid": gpu_uuid(0), "xid": 80})
    assert events.wait(1000) is not None
    assert events.wait(1000) is not None
    node.events_path.write_text(f'{{"uuid": "{gpu_uuid(1)}", "xid": 31}}\n')
    assert events.wait(1000) == NvmlEvent(gpu_uuid(1), EVENT_XID, 31, None, None)


# --- registration -------------------------------------------------------------------------------


def test_registration_not_supported_is_unmonitored(tmp_path: Path) -> None:
    gpus = [
        gpu(0, notSupported=["nvmlDeviceRegisterEvents"]),
        gpu(1, supportedEvents=0x4),
        gpu(2, supportedEvents=0x8),
        gpu(3),
    ]
    node = SimNode(tmp_path, gpus)
    node.append({"uuid": gpu_uuid(3), "lost": True})
    events, failed = node.nvml.event_set([gpu_uuid(i) for i in range(4)])
    assert set(failed) == {gpu_uuid(0), gpu_uuid(1), gpu_uuid(3)}
    assert failed[gpu_uuid(0)].startswith(UNMONITORED)
    assert failed[gpu_uuid(1)].startswith(UNMONITORED)
    assert not failed[gpu_uuid(3)].startswith(UNMONITORED)
    assert "lost" in failed[gpu_uuid(3)]
    node.append({"uuid": gpu_uuid(2), "ecc": "single"}, {"uuid": gpu_uuid(2), "xid": 79})
    assert events.wait(1000) == NvmlEvent(gpu_uuid(2), EVENT_XID, 79, None, None)


# --- probes -------------------------------------------------------------------------------------


def test_probe_healthy(node: SimNode) -> None:
    assert node.nvml.probe(gpu_uuid(1)) == Probe(answers=True, lost=False, recovery_action=0)


def test_probe_pending_states(node: SimNode) -> None:
    node.append(
        {"uuid": gpu_uuid(1), "retiredPagesPending": True},
        {"uuid": gpu_uuid(1), "remappedRowsPending": True, "recoveryAction": 1},
    )
    assert node.nvml.probe(gpu_uuid(1)) == Probe(
        answers=True,
        lost=False,
        retired_pages_pending=True,
        remapped_rows_pending=True,
        recovery_action=1,
    )
    node.append({"uuid": gpu_uuid(1), "retiredPagesPending": False, "remappedRowsPending": False})
    assert node.nvml.probe(gpu_uuid(1)).retired_pages_pending is False


def test_probe_state_on_a_mig_device_reaches_its_gpu(node: SimNode) -> None:
    node.append({"uuid": mig_uuid(0, 0), "remappedRowsPending": True})
    assert node.nvml.probe(gpu_uuid(0)).remapped_rows_pending is True


def test_probe_not_supported_queries(tmp_path: Path) -> None:
    unsupported = [
        "nvmlDeviceGetRetiredPagesPendingStatus",
        "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetFieldValues",
    ]
    node = SimNode(tmp_path, [gpu(0, notSupported=unsupported)])
    node.append({"uuid": gpu_uuid(0), "retiredPagesPending": True, "remappedRowsPending": True})
    assert node.nvml.probe(gpu_uuid(0)) == Probe(answers=True, lost=False, recovery_action=None)


def test_probe_unknown_gpu_does_not_answer(node: SimNode) -> None:
    assert node.nvml.probe(gpu_uuid(7)) == Probe(answers=False, lost=False)
