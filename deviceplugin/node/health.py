"""The health monitor: turns NVML events and probes into health transitions for GPU and MIG UUIDs.

One daemon thread owns all state here. It registers Xid and ECC events once per parent GPU,
waits with a bounded timeout (so `stop` is prompt and an idle node costs no CPU), routes each Xid
to the smallest device it concerns (a MIG device when NVML names a GPU/compute instance, else the
GPU), and asks `xidpolicy` whether it is critical. Every transition goes to `report`, once; the
supervisor maps the UUID to the advertised IDs.

Unlike the upstream plugin, a device comes back: after a hold-down with no new critical Xid, the
GPU is probed (answers NVML, not lost, no pending page retirement or row remap, no pending
recovery action) and reported recovered. A hold-down only counts while events are being watched
on that GPU, so losing the event set suspends it. A failing event wait is retried with backoff;
only if monitoring cannot be restored are the uncovered GPUs marked `health-monitoring-lost`.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from deviceplugin.model.devices import Inventory
from deviceplugin.model.errors import ConfigError, GpuLostError, NvmlError
from deviceplugin.model.log import log_event
from deviceplugin.model.record import record
from deviceplugin.model.xidpolicy import Decision, HealthPolicy
from deviceplugin.node.nvml import (
    EVENT_DOUBLE_BIT_ECC,
    EVENT_SINGLE_BIT_ECC,
    EVENT_XID,
    UNMONITORED,
    EventSet,
    Nvml,
    NvmlEvent,
)

__all__ = ["HealthChange", "HealthMonitor", "HealthPolicy", "MonitorTiming", "parse_duration"]

logger = logging.getLogger(__name__)

GPU_LOST = "gpu-lost"
MONITORING_LOST = "health-monitoring-lost"
RECOVERED = "recovered"

_SECONDS = r"[0-9]+(?:\.[0-9]+)?"
_DURATION_PART = r"([0-9]+(?:\.[0-9]+)?)(ms|h|m|s)"
_DURATION = r"(?:[0-9]+(?:\.[0-9]+)?(?:ms|h|m|s))+"
MAX_DURATION = (2**63 - 1) / 1e9  # Go's longest time.Duration, about 292 years
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_ECC_NAMES = {EVENT_DOUBLE_BIT_ECC: "ecc-dbe", EVENT_SINGLE_BIT_ECC: "ecc-sbe"}


@record(frozen=True)
class HealthChange:
    """One transition: `uuid` is a GPU UUID (the whole GPU) or a MIG UUID (that MIG device)."""

    uuid: str
    healthy: bool
    reason: str
    xid: int | None = None


def xid_health(
    inventory: Inventory,
    decision: Decision,
    gpu_uuid: str,
    gi: int | None,
    ci: int | None,
    gpu_lost: bool,
) -> tuple[list[str], str]:
    """The one rule from an Xid on `gpu_uuid` (and the GPU/compute instance NVML names) to
    health, for the monitor and `dra explain`: the UUIDs it takes away and why. Nothing when the
    policy's `decision` ignores it; the GPU, `gpu-lost`, when it fell off the bus (which says
    more than the Xid); else the MIG devices of the instance, or the GPU, with the Xid's reason."""
    if not decision.fatal:
        return [], ""
    if gpu_lost:
        return [gpu_uuid], GPU_LOST
    return _route(inventory, gpu_uuid, gi, ci), decision.reason


def _route(inventory: Inventory, gpu_uuid: str, gi: int | None, ci: int | None) -> list[str]:
    """The UUIDs an Xid concerns: the MIG devices of its GPU/compute instance, else the GPU."""
    gpu = inventory.gpu(gpu_uuid)
    if gpu is None:
        log_event(logger, "health.route.unknown-gpu", logging.WARNING, uuid=gpu_uuid)
        return [gpu_uuid]
    if gi is None:
        return [gpu.uuid]
    migs = [
        mig.uuid
        for mig in gpu.mig_devices
        if mig.gpu_instance_id == gi and (ci is None or mig.compute_instance_id == ci)
    ]
    if not migs:
        log_event(
            logger,
            "health.route.fallback",
            logging.WARNING,
            uuid=gpu.uuid,
            gi=gi,
            ci=ci,
            why="no MIG device with this GPU/compute instance; marking the GPU",
        )
        return [gpu.uuid]
    return migs


def record_change(unhealthy: dict[str, str], change: HealthChange) -> bool:
    """Apply `change` to the UUID -> reason map of unhealthy devices; False when it changes
    nothing (a recovery of a healthy device, the same reason again), so the caller skips it."""
    if change.healthy:
        return unhealthy.pop(change.uuid, None) is not None
    if unhealthy.get(change.uuid) == change.reason:
        return False
    unhealthy[change.uuid] = change.reason
    return True


def parse_duration(text: str) -> float | None:
    """Seconds for DP_HEALTH_RECOVERY_AFTER: "300", "90s", "5m", "1h30m"; "off" / "never" mean
    no recovery (None)."""
    value = text.strip().lower()
    if value in ("off", "never"):
        return None
    if re.fullmatch(_SECONDS, value):
        seconds = float(value)
    elif re.fullmatch(_DURATION, value):
        seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in re.findall(_DURATION_PART, value))
    else:
        raise ConfigError(
            "DP_HEALTH_RECOVERY_AFTER",
            f"{text!r} is not a duration (e.g. 300, 90s, 5m, 1h30m, off)",
        )
    if seconds > MAX_DURATION:  # also the digits that make a float infinite
        raise ConfigError(
            "DP_HEALTH_RECOVERY_AFTER",
            f"{text[:40]!r} is longer than Go's longest duration (about 292 years); 'off' never"
            " recovers",
        )
    return seconds


@record(frozen=True)
class MonitorTiming:
    """The worker's clock settings; production uses the defaults, tests shorten them."""

    wait: float = 0.5  # longest single event wait: bounds how long stop() takes
    retry: tuple[float, ...] = (0.1, 0.2, 0.4, 0.8, 1.6)  # re-create delays after wait failures
    restore: float = 30.0  # slow retry for lost monitoring, lost GPUs, failed registrations


@record
class _Out:
    """An Unhealthy device; `due` is when to probe it (None: not while its GPU is unwatched)."""

    gpu_uuid: str
    reason: str
    due: float | None


class HealthObserver(Protocol):
    """Receives each health event's Xid and what was done with it (for metrics)."""

    def health_event(self, xid: str, action: str) -> None: ...


class HealthMonitor:
    """Watches every GPU of an inventory from one worker thread and reports health changes."""

    def __init__(
        self,
        nvml: Nvml,
        inventory: Inventory,
        policy: HealthPolicy,
        report: Callable[[HealthChange], None],
        recovery_after: float | None,
        observer: HealthObserver | None = None,
        *,
        timing: MonitorTiming | None = None,
    ) -> None:
        self._nvml = nvml
        self._policy = policy
        self._report = report
        self._recovery_after = recovery_after
        self._observer = observer
        self._timing = timing or MonitorTiming()
        self._lock = threading.Lock()
        self._new_inventory: Inventory | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Worker-thread state below.
        self._inventory = inventory
        self._events: EventSet | None = None
        self._registered: list[str] = []  # the GPUs the event set was created for
        self._watched: frozenset[str] = frozenset()  # ... of which events reach us (or never can)
        self._failed: frozenset[str] = frozenset()  # ... of which registration failed
        self._unmonitored: frozenset[str] = frozenset()  # ... of which NVML has no such events
        self._lost: dict[str, float] = {}  # GPUs known lost (left out of the event set): when
        # to check whether each answers again
        self._out: dict[str, _Out] = {}
        self._failures = 0  # consecutive event-set failures
        self._monitoring_lost = False
        self._next_open = 0.0  # monotonic time of the next event-set (re)creation

    # --- public ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the worker thread (once)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="health-monitor", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop the worker; returns within about one wait timeout."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self._timing.wait + 1.0)
            if self._thread.is_alive():
                log_event(logger, "health.monitor.stop-slow", logging.WARNING)

    def update_inventory(self, inventory: Inventory) -> None:
        """Adopt a rediscovered inventory at the worker's next turn."""
        with self._lock:
            self._new_inventory = inventory

    @property
    def alive(self) -> bool:
        """The worker runs and health monitoring has not been lost."""
        thread = self._thread
        running = thread is not None and thread.is_alive() and not self._stop.is_set()
        return running and not self._monitoring_lost

    # --- the worker -----------------------------------------------------------------------------

    def _run(self) -> None:
        if not self._policy.watches_xids:
            log_event(logger, "health.disabled", reason="DP_DISABLE_HEALTHCHECKS")
            self._stop.wait()
            return
        while not self._stop.is_set():
            try:
                self._turn()
            except Exception as exc:  # the loop must outlive any bug or NVML surprise
                log_event(logger, "health.loop.error", logging.ERROR, error=repr(exc))
                logger.debug("health.loop.traceback", exc_info=True)
                self._stop.wait(self._timing.wait)
        self._close(self._events)

    def _turn(self) -> None:
        self._adopt_inventory()
        if time.monotonic() >= self._next_open:
            self._open()
        self._probe_due(time.monotonic())
        timeout = self._timeout(time.monotonic())
        events = self._events
        if events is None:
            self._stop.wait(timeout)
            return
        try:
            event = events.wait(max(1, math.ceil(timeout * 1000)))
        except GpuLostError as exc:
            self._on_lost(exc)
            return
        except NvmlError as exc:
            self._on_failure(exc)
            return
        if self._failures:
            log_event(
                logger,
                "health.monitor.restored",
                attempts=self._failures,
                gpus=sorted(self._watched),
            )
            self._failures = 0
            self._monitoring_lost = False
        if event is not None:
            self._on_event(event)

    def _adopt_inventory(self) -> None:
        with self._lock:
            inventory, self._new_inventory = self._new_inventory, None
        if inventory is None:
            return
        old = {gpu.uuid for gpu in self._inventory.gpus}
        self._inventory = inventory
        if {gpu.uuid for gpu in inventory.gpus} != old:
            self._next_open = min(self._next_open, time.monotonic())

    def _timeout(self, now: float) -> float:
        """Seconds to wait: at most `timing.wait`, less when a probe or retry is due sooner."""
        deadline = min(now + self._timing.wait, self._next_open)
        for entry in self._out.values():
            if entry.due is not None:
                deadline = min(deadline, entry.due)
        return max(0.001, deadline - now)

    # --- the event set --------------------------------------------------------------------------

    def _open(self) -> None:
        """(Re)create the event set for every GPU not known to be lost, when that changes
        anything: first time, after a failure, a new GPU list, a lost GPU back, a failed
        registration to retry."""
        now = time.monotonic()
        for uuid, due in sorted(self._lost.items()):
            if due > now:
                continue  # just found lost: no use asking again before `restore` has passed
            if self._nvml.probe(uuid).lost:
                self._lost[uuid] = now + self._timing.restore
            else:
                del self._lost[uuid]
                log_event(logger, "health.gpu.back", uuid=uuid)
        gpus = [gpu.uuid for gpu in self._inventory.gpus if gpu.uuid not in self._lost]
        self._next_open = min(self._lost.values(), default=math.inf)
        if self._events is not None and gpus == self._registered and not self._failed:
            return
        try:
            events, failed = self._nvml.event_set(gpus)
        except NvmlError as exc:
            if self._events is None:
                self._on_failure(exc)
            else:  # keep watching with the set we have
                log_event(logger, "health.monitor.reopen-failed", logging.WARNING, error=str(exc))
                self._next_open = now + self._timing.restore
            return
        self._close(self._events)
        self._events, self._registered = events, gpus
        self._unmonitored = frozenset(u for u, why in failed.items() if why.startswith(UNMONITORED))
        self._failed = frozenset(failed) - self._unmonitored
        self._watched = frozenset(gpus) - self._failed
        log_event(
            logger,
            "health.monitor.watching",
            gpus=sorted(self._watched - self._unmonitored),
            unmonitored=sorted(self._unmonitored),
            unregistered=sorted(self._failed),
            lost=sorted(self._lost),
        )
        for uuid in sorted(self._failed):
            if self._nvml.probe(uuid).lost:
                self._gpu_lost(uuid, now)
            elif uuid not in self._out:
                self._mark(uuid, uuid, failed[uuid], None, now)
        if self._failed:
            self._next_open = min(self._next_open, now + self._timing.restore)
        self._rearm(now)

    def _on_failure(self, exc: NvmlError) -> None:
        """Drop the event set and schedule its re-creation: soon at first, slowly once lost."""
        self._failures += 1
        self._close(self._events)
        self._events, self._watched = None, frozenset()
        now = time.monotonic()
        self._rearm(now)
        if self._failures <= len(self._timing.retry):
            delay = self._timing.retry[self._failures - 1]
            log_event(
                logger,
                "health.monitor.retry",
                logging.WARNING,
                attempt=self._failures,
                delay=delay,
                error=str(exc),
            )
        else:
            delay = self._timing.restore
            if not self._monitoring_lost:
                self._monitoring_lost = True
                log_event(
                    logger,
                    "health.monitor.lost",
                    logging.ERROR,
                    error=str(exc),
                    attempts=self._failures - 1,
                    retry_every=delay,
                )
                for gpu in self._inventory.gpus:
                    if gpu.uuid not in self._out and gpu.uuid not in self._unmonitored:
                        self._mark(gpu.uuid, gpu.uuid, MONITORING_LOST, None, now)
        self._next_open = now + delay

    def _on_lost(self, exc: GpuLostError) -> None:
        """A wait said some GPU is lost: find which by probing, then re-register without it."""
        lost = [uuid for uuid in sorted(self._watched) if self._nvml.probe(uuid).lost]
        if not lost:
            self._on_failure(exc)
            return
        for uuid in lost:
            self._gpu_lost(uuid, time.monotonic())

    def _gpu_lost(self, uuid: str, now: float) -> None:
        """Mark a lost GPU and re-register without it (its events would only fail the wait)."""
        if uuid not in self._lost:
            log_event(logger, "health.gpu.lost", logging.WARNING, uuid=uuid)
            self._lost[uuid] = now + self._timing.restore
        self._mark(uuid, uuid, GPU_LOST, None, now)
        self._next_open = now

    @staticmethod
    def _close(events: EventSet | None) -> None:
        if events is None:
            return
        try:
            events.close()
        except NvmlError as exc:
            log_event(logger, "health.monitor.close-failed", logging.WARNING, error=str(exc))

    # --- events ---------------------------------------------------------------------------------

    def _on_event(self, event: NvmlEvent) -> None:
        fields: dict[str, Any] = {
            "uuid": event.gpu_uuid,
            "xid": event.xid,
            "gi": event.gpu_instance_id,
            "ci": event.compute_instance_id,
        }
        if event.event_type != EVENT_XID:
            kind = _ECC_NAMES.get(event.event_type, f"type-{event.event_type:#x}")
            # ECC events only count: a double-bit error is followed by Xid 48, which carries
            # the policy decision (and its DP_DISABLE/ENABLE overrides).
            log_event(logger, "health.event", **fields, decision="recorded", action=kind)
            self._count(kind, "recorded")
            return
        decision = self._policy.decide(event.xid)
        if not decision.fatal:
            log_event(
                logger, "health.ignored", **fields, decision="ignored", action=decision.action
            )
            self._count(str(event.xid), "ignored")
            return
        lost = self._nvml.probe(event.gpu_uuid).lost
        gi, ci = event.gpu_instance_id, event.compute_instance_id
        targets, reason = xid_health(self._inventory, decision, event.gpu_uuid, gi, ci, lost)
        if reason == GPU_LOST:
            log_event(logger, "health.event", **fields, decision="unhealthy", action="GPU_LOST")
            self._gpu_lost(event.gpu_uuid, time.monotonic())
            self._count(str(event.xid), "unhealthy")
            return
        log_event(
            logger,
            "health.event",
            **fields,
            decision="unhealthy",
            action=decision.action,
            targets=targets,
        )
        now = time.monotonic()
        for uuid in targets:
            self._mark(uuid, event.gpu_uuid, reason, event.xid, now)
        self._count(str(event.xid), "unhealthy")

    def _count(self, xid: str, action: str) -> None:
        if self._observer is not None:
            self._observer.health_event(xid, action)

    # --- transitions and recovery ---------------------------------------------------------------

    def _mark(self, uuid: str, gpu_uuid: str, reason: str, xid: int | None, now: float) -> None:
        """Take `uuid` out (or keep it out) and restart its hold-down; report only a change."""
        previous = self._out.get(uuid)
        self._out[uuid] = _Out(gpu_uuid, reason, self._due(gpu_uuid, now))
        if previous is None or previous.reason != reason:
            self._report(HealthChange(uuid, False, reason, xid))

    def _due(self, gpu_uuid: str, now: float) -> float | None:
        if self._recovery_after is None or gpu_uuid not in self._watched:
            return None
        return now + self._recovery_after

    def _rearm(self, now: float) -> None:
        """Start hold-downs for devices whose GPU became watched; suspend the unwatched ones."""
        for entry in self._out.values():
            if entry.gpu_uuid not in self._watched:
                entry.due = None
            elif entry.due is None:
                entry.due = self._due(entry.gpu_uuid, now)

    def _probe_due(self, now: float) -> None:
        """Probe each device whose hold-down has passed; one probe per GPU per turn."""
        verdicts: dict[str, str | None] = {}
        for uuid, entry in list(self._out.items()):
            if entry.due is None or entry.due > now or self._out.get(uuid) is not entry:
                continue
            if entry.gpu_uuid not in verdicts:
                verdicts[entry.gpu_uuid] = self._probe(entry.gpu_uuid)
            problem = verdicts[entry.gpu_uuid]
            if problem is None:
                del self._out[uuid]
                self._report(HealthChange(uuid, True, RECOVERED))
                continue
            if problem == GPU_LOST:
                self._gpu_lost(entry.gpu_uuid, now)
            entry.due = self._due(entry.gpu_uuid, now)

    def _probe(self, gpu_uuid: str) -> str | None:
        """Why the GPU cannot serve yet, or None when it can."""
        probe = self._nvml.probe(gpu_uuid)
        problem = (
            GPU_LOST
            if probe.lost
            else "not-answering"
            if not probe.answers
            else "retired-pages-pending"
            if probe.retired_pages_pending
            else "remapped-rows-pending"
            if probe.remapped_rows_pending
            else f"recovery-action-{probe.recovery_action}"
            if probe.recovery_action
            else None
        )
        log_event(logger, "health.probe", uuid=gpu_uuid, ok=problem is None, problem=problem or "")
        return problem
