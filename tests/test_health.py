"""Health: the Xid policy and its knobs, duration parsing, and the monitor running on the
simulator's NVML with a real events file (a hand-made event set only where the simulator cannot
produce the failure)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from deviceplugin.model.devices import Gpu, Inventory, MigDevice
from deviceplugin.model.errors import ConfigError, NvmlError
from deviceplugin.model.xidpolicy import REFERENCE_IGNORED
from deviceplugin.node.health import (
    HealthChange,
    HealthMonitor,
    HealthPolicy,
    MonitorTiming,
    parse_duration,
)
from deviceplugin.node.nvml import EVENT_XID, EventSet, Nvml, NvmlEvent, Probe
from deviceplugin.node.xidcatalog import policy_from_env, xid_table
from deviceplugin.ops.metrics import Metrics
from deviceplugin.sim.simulator import NodeSimulator

GPU0 = "GPU-8e2f3c10-0000-4000-8000-000000000000"
GPU1 = "GPU-8e2f3c10-0000-4000-8000-000000000001"
MIG_A = "MIG-0f1d3a5e-0000-4000-8000-000000000000"  # GPU0, GI 9
MIG_B = "MIG-0f1d3a5e-0000-4000-8000-000000000001"  # GPU0, GI 10

NODE = {
    "driverVersion": "550.90.07",
    "cudaDriverVersion": 12040,
    "gpus": [
        {
            "uuid": GPU0,
            "name": "NVIDIA A100-SXM4-80GB",
            "memoryMiB": 81920,
            "pciBusId": "00000000:07:00.0",
            "computeCapability": "8.0",
            "migCapable": True,
            "migEnabled": True,
            "migDevices": [
                {"profile": "1g.10gb", "uuid": MIG_A, "gpuInstanceId": 9, "computeInstanceId": 0},
                {"profile": "1g.10gb", "uuid": MIG_B, "gpuInstanceId": 10, "computeInstanceId": 0},
            ],
        },
        {
            "uuid": GPU1,
            "name": "NVIDIA A100-SXM4-80GB",
            "memoryMiB": 81920,
            "pciBusId": "00000000:0F:00.0",
            "computeCapability": "8.0",
        },
    ],
}


def _mig(uuid: str, index: int, gi: int) -> MigDevice:
    return MigDevice(uuid, index, gi, 0, "1g.10gb", 9984, 1, 1)


def _inventory(migs: tuple[MigDevice, ...] | None = None) -> Inventory:
    """The inventory discovery would build for NODE (by hand, to keep this test self-contained)."""
    if migs is None:
        migs = (_mig(MIG_A, 0, 9), _mig(MIG_B, 1, 10))
    gpu0 = Gpu(
        0, GPU0, "NVIDIA A100-SXM4-80GB", 81920, 0, "00000000:07:00.0", 0, "8.0", True, True, migs
    )
    gpu1 = Gpu(1, GPU1, "NVIDIA A100-SXM4-80GB", 81920, 1, "00000000:0F:00.0", 0, "8.0")
    return Inventory(gpus=(gpu0, gpu1))


# --- durations ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        pytest.param("300", 300.0, id="bare-seconds"),
        pytest.param("0.2", 0.2, id="fraction"),
        pytest.param("300s", 300.0, id="seconds"),
        pytest.param("5m", 300.0, id="minutes"),
        pytest.param("1h", 3600.0, id="hours"),
        pytest.param("1m30s", 90.0, id="compound"),
        pytest.param(" 1H30M ", 5400.0, id="case-and-space"),
        pytest.param("250ms", 0.25, id="milliseconds"),
        pytest.param("off", None, id="off"),
        pytest.param("never", None, id="never"),
    ],
)
def test_parse_duration(text: str, seconds: float | None) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "-5", "5d", "m5", "inf", "nan", "1e3", "5 m"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_duration(text)
    assert caught.value.path == "DP_HEALTH_RECOVERY_AFTER"


@pytest.mark.parametrize("text", ["9" * 400, "9" * 400 + "h", "9223372037", "2562048h"])
def test_parse_duration_refuses_more_than_go_holds_rather_than_an_infinite_wait(text: str) -> None:
    with pytest.raises(ConfigError, match="longer than Go's longest duration") as caught:
        parse_duration(text)
    assert caught.value.path == "DP_HEALTH_RECOVERY_AFTER"
    assert parse_duration("2562047h") == 2562047 * 3600.0  # Go's longest, in whole hours


# --- policy -------------------------------------------------------------------------------------


def test_xid_table_is_packaged_and_complete() -> None:
    table = xid_table()
    assert {8, 13, 31, 43, 45, 48, 61, 63, 79, 94, 95, 109, 154}.issubset(table)
    assert {info.back for info in table.values()} <= {
        "app_restart",
        "gpu_reset",
        "node_reboot",
        "depends",
    }
    assert table[95].mnemonic == "ROBUST_CHANNEL_UNCONTAINED_ERROR"
    assert table[94].action == "RESTART_APP"


POLICY_CASES = [
    # (env, xid, fatal, reason)
    pytest.param({}, 79, True, "xid-79", id="reference-critical"),
    pytest.param({}, 999, True, "xid-999", id="reference-unknown"),
    pytest.param({}, 94, True, "xid-94", id="reference-94-fatal-like-upstream"),
    *[
        pytest.param({}, xid, False, "", id=f"reference-ignores-{xid}")
        for xid in sorted(REFERENCE_IGNORED)
    ],
    pytest.param({"DP_DISABLE_HEALTHCHECKS": "79, 48"}, 48, False, "", id="disable-list"),
    pytest.param({"DP_DISABLE_HEALTHCHECKS": "79,junk,48x"}, 95, True, "xid-95", id="disable-junk"),
    pytest.param({"DP_DISABLE_HEALTHCHECKS": "all"}, 79, False, "", id="disable-all"),
    pytest.param({"DP_DISABLE_HEALTHCHECKS": "XIDS"}, 79, False, "", id="disable-xids"),
    pytest.param({"DP_ENABLE_HEALTHCHECKS": "13"}, 13, True, "xid-13", id="enable-13"),
    pytest.param({"DP_ENABLE_HEALTHCHECKS": "all"}, 43, True, "xid-43", id="enable-all"),
    pytest.param(
        {"DP_DISABLE_HEALTHCHECKS": "all", "DP_ENABLE_HEALTHCHECKS": "48"},
        48,
        True,
        "xid-48",
        id="enable-wins-over-disable-all",
    ),
    pytest.param(
        {"DP_DISABLE_HEALTHCHECKS": "all", "DP_ENABLE_HEALTHCHECKS": "48"},
        79,
        False,
        "",
        id="disable-all-keeps-others-off",
    ),
    pytest.param(
        {"DP_DISABLE_HEALTHCHECKS": "13", "DP_ENABLE_HEALTHCHECKS": "13"},
        13,
        True,
        "xid-13",
        id="enable-wins-over-disable-list",
    ),
    pytest.param({"DP_HEALTH_POLICY": "catalog"}, 94, False, "", id="catalog-94-restart-app"),
    pytest.param({"DP_HEALTH_POLICY": "catalog"}, 63, False, "", id="catalog-63-ignore"),
    pytest.param({"DP_HEALTH_POLICY": "catalog"}, 45, False, "", id="catalog-45-workflow"),
    pytest.param(
        {"DP_HEALTH_POLICY": "catalog"}, 95, True, "xid-95: RESET_GPU", id="catalog-95-reset"
    ),
    pytest.param(
        {"DP_HEALTH_POLICY": "catalog"}, 48, True, "xid-48: RESET_GPU", id="catalog-48-workflow"
    ),
    pytest.param(
        {"DP_HEALTH_POLICY": "Catalog"}, 79, True, "xid-79: RESTART_BM", id="catalog-79-reboot"
    ),
    pytest.param(
        {"DP_HEALTH_POLICY": "catalog"}, 109, True, "xid-109: RESET_GPU", id="catalog-109-reset"
    ),
    pytest.param({"DP_HEALTH_POLICY": "catalog"}, 999, True, "xid-999", id="catalog-unknown"),
    pytest.param({"DP_HEALTH_POLICY": "catalog"}, 200, True, "xid-200", id="catalog-unlisted"),
    pytest.param(
        {"DP_HEALTH_POLICY": "catalog", "DP_ENABLE_HEALTHCHECKS": "94"},
        94,
        True,
        "xid-94",
        id="catalog-enable-94",
    ),
]


@pytest.mark.parametrize(("env", "xid", "fatal", "reason"), POLICY_CASES)
def test_policy_decides(env: dict[str, str], xid: int, fatal: bool, reason: str) -> None:
    decision = policy_from_env(env).decide(xid)
    assert (decision.fatal, decision.reason) == (fatal, reason)


def test_policy_rejects_unknown_name() -> None:
    with pytest.raises(ConfigError) as caught:
        policy_from_env({"DP_HEALTH_POLICY": "strict"})
    assert caught.value.path == "DP_HEALTH_POLICY"


def test_policy_watches_unless_everything_disabled() -> None:
    assert policy_from_env({}).watches_xids
    assert not policy_from_env({"DP_DISABLE_HEALTHCHECKS": "all"}).watches_xids
    assert policy_from_env(
        {"DP_DISABLE_HEALTHCHECKS": "all", "DP_ENABLE_HEALTHCHECKS": "48"}
    ).watches_xids


# --- the monitor on the simulator ---------------------------------------------------------------

FAST = MonitorTiming(wait=0.05, retry=(0.01, 0.02, 0.04), restore=0.1)


class WatchedNvml(Nvml):
    """The real adapter on the simulator, with counters the tests wait on, and failures the
    simulator cannot make: event-set creation failing for good, one GPU refusing registration."""

    def __init__(self, inner: Nvml) -> None:
        super().__init__(inner.module, inner.numa_reader)
        self.opened: list[list[str]] = []
        self.probes: list[str] = []
        self.fail_open = False
        self.refuse: set[str] = set()

    def event_set(self, gpu_uuids: list[str]) -> tuple[EventSet, dict[str, str]]:
        if self.fail_open:
            raise NvmlError("creating an NVML event set: Unknown Error", 999)
        refused = [uuid for uuid in gpu_uuids if uuid in self.refuse]
        events, failed = super().event_set([u for u in gpu_uuids if u not in refused])
        self.opened.append(list(gpu_uuids))
        failed.update((uuid, "event registration failed: Unknown Error") for uuid in refused)
        return events, failed

    def probe(self, gpu_uuid: str) -> Probe:
        self.probes.append(gpu_uuid)
        return super().probe(gpu_uuid)


@dataclass
class Reports:
    """What the worker thread reported, each with the monotonic time it arrived."""

    timed: list[tuple[float, HealthChange]] = field(default_factory=list)
    cond: threading.Condition = field(default_factory=threading.Condition)

    def __call__(self, change: HealthChange) -> None:
        with self.cond:
            self.timed.append((time.monotonic(), change))
            self.cond.notify_all()

    @property
    def changes(self) -> list[HealthChange]:
        with self.cond:
            return [change for _, change in self.timed]

    def wait_for(self, count: int, timeout: float = 5.0) -> list[HealthChange]:
        """The first `count` changes, once they have arrived."""
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.timed) >= count, timeout), self.timed
            return [change for _, change in self.timed[:count]]

    def time_of(self, change: HealthChange) -> float:
        return next(at for at, seen in self.timed if seen == change)


def eventually(check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


@dataclass
class World:
    """A simulated node, its events file, and one running monitor."""

    events: Path
    nvml: WatchedNvml
    metrics: Metrics
    reports: Reports
    monitor: HealthMonitor

    def append(self, *lines: dict[str, object] | str) -> None:
        with self.events.open("a") as stream:
            for line in lines:
                stream.write((line if isinstance(line, str) else json.dumps(line)) + "\n")

    def xid(self, uuid: str, xid: int) -> None:
        self.append({"uuid": uuid, "xid": xid})

    def counted(self, xid: str, action: str) -> float:
        value = self.metrics.registry.get_sample_value(
            "deviceplugin_health_events_total", {"xid": xid, "action": action}
        )
        return value or 0.0

    def wait_counted(self, xid: str, action: str, count: int = 1) -> None:
        eventually(lambda: self.counted(xid, action) >= count)


Start = Callable[..., World]


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Start]:
    """start(env=..., recovery_after=..., inventory=..., node=...) -> a World whose monitor has
    registered its events (lines appended before that would reach no event set)."""
    monitors: list[HealthMonitor] = []

    def _start(
        env: dict[str, str] | None = None,
        recovery_after: float | None = 0.2,
        inventory: Inventory | None = None,
        node: dict[str, object] | None = None,
        timing: MonitorTiming = FAST,
        before: Callable[[World], None] | None = None,
    ) -> World:
        node_file = tmp_path / "node.yaml"
        node_file.write_text(json.dumps(node or NODE))
        events = tmp_path / "events.jsonl"
        events.touch()
        nvml = WatchedNvml(NodeSimulator(str(node_file)).open_nvml(str(events)))
        nvml.init()
        metrics, reports = Metrics(), Reports()
        policy = policy_from_env(env or {})
        monitor = HealthMonitor(
            nvml, inventory or _inventory(), policy, reports, recovery_after, metrics, timing=timing
        )
        world = World(events, nvml, metrics, reports, monitor)
        if before is not None:
            before(world)
        monitors.append(monitor)
        monitor.start()
        if policy.watches_xids:
            eventually(lambda: bool(nvml.opened))
        return world

    yield _start
    for monitor in monitors:
        monitor.stop()


def test_xid_on_a_whole_gpu_reports_the_gpu_once(start: Start) -> None:
    world = start()
    world.xid(GPU0, 79)
    world.xid(GPU0, 79)  # same reason again: no second report
    world.wait_counted("79", "unhealthy", 2)
    assert world.reports.changes == [HealthChange(GPU0, False, "xid-79", 79)]


def test_xid_on_a_mig_device_reports_only_that_mig_device(start: Start) -> None:
    world = start()
    world.xid(MIG_B, 48)
    world.wait_counted("48", "unhealthy")
    assert world.reports.changes == [HealthChange(MIG_B, False, "xid-48", 48)]


def test_mig_event_without_a_known_mig_device_falls_back_to_the_gpu(start: Start) -> None:
    world = start(inventory=_inventory(migs=(_mig(MIG_A, 0, 9),)))  # MIG_B not discovered
    world.xid(MIG_B, 48)
    world.wait_counted("48", "unhealthy")
    assert world.reports.changes == [HealthChange(GPU0, False, "xid-48", 48)]


def test_application_xids_mark_nothing(start: Start) -> None:
    world = start()
    for xid in sorted(REFERENCE_IGNORED):
        world.xid(GPU1, xid)
    for xid in sorted(REFERENCE_IGNORED):
        world.wait_counted(str(xid), "ignored")
    assert world.reports.changes == []


@pytest.mark.parametrize(
    ("env", "xids", "reasons"),
    [
        pytest.param(
            {"DP_DISABLE_HEALTHCHECKS": "79,nonsense"}, [79, 48], ["xid-48"], id="disable-list"
        ),
        pytest.param({"DP_ENABLE_HEALTHCHECKS": "13"}, [13, 31], ["xid-13"], id="enable-13"),
        pytest.param(
            {"DP_DISABLE_HEALTHCHECKS": "all", "DP_ENABLE_HEALTHCHECKS": "48"},
            [79, 13, 48],
            ["xid-48"],
            id="enable-wins-over-disable-all",
        ),
        pytest.param(
            {"DP_HEALTH_POLICY": "catalog"},
            [94, 63, 95, 79],
            ["xid-95: RESET_GPU", "xid-79: RESTART_BM"],
            id="catalog",
        ),
    ],
)
def test_env_knobs_choose_which_xids_mark(
    start: Start, env: dict[str, str], xids: list[int], reasons: list[str]
) -> None:
    world = start(env=env)
    for n, xid in enumerate(xids):
        world.xid(GPU1 if n % 2 else GPU0, xid)
    eventually(
        lambda: (
            sum(world.counted(str(x), a) for x in xids for a in ("ignored", "unhealthy"))
            == len(xids)
        )
    )
    assert [change.reason for change in world.reports.changes] == reasons


def test_disable_all_switches_monitoring_off(start: Start) -> None:
    world = start(env={"DP_DISABLE_HEALTHCHECKS": "all"})
    world.xid(GPU0, 79)
    time.sleep(0.2)
    assert world.monitor.alive
    assert world.nvml.opened == []
    assert world.reports.changes == []


def test_ecc_events_are_counted_not_marked(start: Start) -> None:
    world = start()
    world.append({"uuid": GPU0, "ecc": "double"}, {"uuid": GPU1, "ecc": "single"})
    world.wait_counted("ecc-dbe", "recorded")
    world.wait_counted("ecc-sbe", "recorded")
    assert world.reports.changes == []


def test_malformed_lines_do_not_stop_the_loop(start: Start) -> None:
    world = start()
    world.append(
        "not json",
        "[1, 2]",
        {"uuid": 5, "xid": 79},
        {"uuid": GPU0, "xid": -1},
        {"uuid": "GPU-unknown", "xid": 79},
    )
    world.xid(GPU1, 79)
    assert world.reports.wait_for(1) == [HealthChange(GPU1, False, "xid-79", 79)]


def test_recovers_after_the_hold_down(start: Start) -> None:
    world = start(recovery_after=0.2)
    sent = time.monotonic()
    world.xid(GPU0, 48)
    out, back = world.reports.wait_for(2)
    assert out == HealthChange(GPU0, False, "xid-48", 48)
    assert back == HealthChange(GPU0, True, "recovered")
    assert world.reports.time_of(back) - sent >= 0.2


def test_a_new_xid_during_the_hold_down_restarts_it(start: Start) -> None:
    world = start(recovery_after=0.5)
    world.xid(MIG_A, 48)
    world.reports.wait_for(1)
    time.sleep(0.3)
    again = time.monotonic()
    world.xid(MIG_A, 48)
    world.wait_counted("48", "unhealthy", 2)
    back = world.reports.wait_for(2)[1]
    assert back == HealthChange(MIG_A, True, "recovered")
    assert world.reports.time_of(back) - again >= 0.5


def test_pending_row_remapping_blocks_recovery_until_cleared(start: Start) -> None:
    world = start(recovery_after=0.1)
    world.append({"uuid": GPU1, "remappedRowsPending": True, "xid": 48})
    world.reports.wait_for(1)
    eventually(lambda: world.nvml.probes.count(GPU1) >= 2)
    assert world.reports.changes == [HealthChange(GPU1, False, "xid-48", 48)]
    world.append({"uuid": GPU1, "remappedRowsPending": False})
    assert world.reports.wait_for(2)[1] == HealthChange(GPU1, True, "recovered")


def test_recovery_action_blocks_recovery_until_none(start: Start) -> None:
    world = start(recovery_after=0.1)
    world.append({"uuid": GPU0, "recoveryAction": 1, "xid": 154})
    world.reports.wait_for(1)
    eventually(lambda: world.nvml.probes.count(GPU0) >= 2)
    assert len(world.reports.changes) == 1
    world.append({"uuid": GPU0, "recoveryAction": 0})
    assert world.reports.wait_for(2)[1] == HealthChange(GPU0, True, "recovered")


def test_recovery_off_keeps_devices_out(start: Start) -> None:
    world = start(recovery_after=None)
    world.xid(GPU1, 48)
    world.reports.wait_for(1)
    time.sleep(0.2)
    assert world.nvml.probes == [GPU1], "only the is-it-lost check at the event, no recovery probe"
    assert len(world.reports.changes) == 1


def test_a_gpu_that_fell_off_the_bus_is_reported_lost_not_by_its_xid(start: Start) -> None:
    world = start(recovery_after=None)
    world.append({"uuid": GPU1, "lost": True})  # the simulator raises Xid 79 with it
    assert world.reports.wait_for(1) == [HealthChange(GPU1, False, "gpu-lost")]


def test_lost_gpu_is_found_by_probing_and_comes_back(start: Start) -> None:
    world = start(recovery_after=0.1)
    world.append({"uuid": GPU1, "lost": True, "xid": 13}, {"waitError": "gpuIsLost"})
    assert world.reports.wait_for(1) == [HealthChange(GPU1, False, "gpu-lost")]
    eventually(lambda: GPU1 not in world.nvml.opened[-1])  # re-registered without it
    world.xid(GPU0, 79)  # the others are still watched
    assert world.reports.wait_for(2)[1] == HealthChange(GPU0, False, "xid-79", 79)
    world.append({"uuid": GPU1, "lost": False})
    eventually(lambda: HealthChange(GPU1, True, "recovered") in world.reports.changes)


def test_gpu_lost_before_start_is_reported_lost(start: Start) -> None:
    world = start(before=lambda w: w.append({"uuid": GPU1, "lost": True}))
    assert world.reports.wait_for(1) == [HealthChange(GPU1, False, "gpu-lost")]


def test_a_gpu_without_event_support_stays_healthy_and_unmonitored(start: Start) -> None:
    node = json.loads(json.dumps(NODE))
    node["gpus"][1]["supportedEvents"] = 0
    world = start(node=node)
    world.xid(GPU0, 79)
    assert world.reports.wait_for(1) == [HealthChange(GPU0, False, "xid-79", 79)]
    assert world.monitor.alive


def test_a_gpu_that_refuses_registration_is_out_until_it_registers(start: Start) -> None:
    world = start(recovery_after=0.1, before=lambda w: w.nvml.refuse.add(GPU1))
    assert world.reports.wait_for(1) == [
        HealthChange(GPU1, False, "event registration failed: Unknown Error")
    ]
    eventually(lambda: len(world.nvml.opened) >= 2)  # retried at the slow rate, still refused
    assert len(world.reports.changes) == 1
    world.nvml.refuse.clear()
    assert world.reports.wait_for(2)[1] == HealthChange(GPU1, True, "recovered")


def test_a_failed_wait_recreates_the_event_set_without_marking(start: Start) -> None:
    world = start()
    world.append({"waitError": "unknown"})
    eventually(lambda: len(world.nvml.opened) == 2)
    world.xid(GPU1, 79)
    assert world.reports.wait_for(1) == [HealthChange(GPU1, False, "xid-79", 79)]
    assert world.monitor.alive


def test_monitoring_that_cannot_be_restored_marks_the_gpus_then_recovers(start: Start) -> None:
    world = start(recovery_after=0.3)
    world.xid(GPU0, 48)
    world.reports.wait_for(1)
    world.nvml.fail_open = True
    world.append({"waitError": "unknown"})
    lost = world.reports.wait_for(2)[1]
    assert lost == HealthChange(GPU1, False, "health-monitoring-lost")  # GPU0 is out already
    assert not world.monitor.alive
    time.sleep(0.5)  # past GPU0's hold-down: unwatched time does not count towards it
    assert len(world.reports.changes) == 2
    world.nvml.fail_open = False
    back = world.reports.wait_for(4)[2:]
    assert {(c.uuid, c.healthy) for c in back} == {(GPU0, True), (GPU1, True)}
    assert world.monitor.alive


def test_update_inventory_registers_the_new_gpu_list(start: Start) -> None:
    world = start()
    world.monitor.update_inventory(Inventory(gpus=_inventory().gpus[:1]))
    eventually(lambda: world.nvml.opened[-1] == [GPU0])
    world.xid(MIG_A, 48)
    assert world.reports.wait_for(1) == [HealthChange(MIG_A, False, "xid-48", 48)]


def test_stop_returns_promptly(start: Start) -> None:
    world = start(timing=MonitorTiming())  # the production one-second wait
    began = time.monotonic()
    world.monitor.stop()
    assert time.monotonic() - began < 2.0
    assert not world.monitor.alive


# --- the loop against a hand-made event set -----------------------------------------------------


class FlakyEventSet(EventSet):
    """Raises an unexpected exception once, then delivers one Xid, then times out."""

    def __init__(self) -> None:
        self.script: list[NvmlEvent | Exception] = [
            RuntimeError("bug"),
            NvmlEvent(GPU0, EVENT_XID, 79),
        ]

    def wait(self, timeout_ms: int) -> NvmlEvent | None:
        if self.script:
            step = self.script.pop(0)
            if isinstance(step, Exception):
                raise step
            return step
        time.sleep(timeout_ms / 1000)
        return None

    def close(self) -> None:
        pass


class FlakyNvml(Nvml):
    def __init__(self) -> None:
        self.sets: list[FlakyEventSet] = []

    def event_set(self, gpu_uuids: list[str]) -> tuple[EventSet, dict[str, str]]:
        self.sets.append(FlakyEventSet())
        return self.sets[-1], {}

    def probe(self, gpu_uuid: str) -> Probe:
        return Probe(answers=True, lost=False)


def test_an_unexpected_exception_does_not_stop_the_loop() -> None:
    reports = Reports()
    monitor = HealthMonitor(FlakyNvml(), _inventory(), HealthPolicy(), reports, None, timing=FAST)
    monitor.start()
    try:
        assert reports.wait_for(1) == [HealthChange(GPU0, False, "xid-79", 79)]
        assert monitor.alive
    finally:
        monitor.stop()
