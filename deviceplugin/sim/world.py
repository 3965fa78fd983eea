"""The simulated node as it is right now: the node file (re-read when it changes), the per-GPU
state that event lines change (lost, pending repairs), and the event sets waiting for events.

Event lines are applied when read (`pump`, called by every simulated NVML call). An event
reaches the event sets registered for its GPU at that moment; with no such set it is dropped,
as NVML drops events nobody registered for. Runtime state is kept by UUID across node-file
reloads. One lock guards it all: NVML may be called from several threads. A set holds at most
MAX_QUEUED events nobody has waited for; later ones are dropped, with one note.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import field
from pathlib import Path

from deviceplugin.model.errors import ConfigError
from deviceplugin.model.log import log_event
from deviceplugin.model.record import record
from deviceplugin.sim import structs as s
from deviceplugin.sim.events import EventFile, EventFileWatch, SimEvent
from deviceplugin.sim.node import (
    Node,
    SimGpu,
    SimMig,
    read_node,
    read_node_once,
    resolve_node_path,
)

logger = logging.getLogger(__name__)

_NO_INSTANCE = 0xFFFFFFFF
MAX_QUEUED = 4096  # events a set holds for a wait (native/events.c: the same)
_XID_FALLEN_OFF_BUS = 79


@record(eq=False)
class SimEventSet:
    """nvmlEventSet_t: what the set listens to and what it has not yet handed out."""

    masks: dict[str, int] = field(default_factory=dict)
    queue: deque[s.EventData] = field(default_factory=deque)
    wait_error: int | None = None
    freed: bool = False
    dropped: int = 0


@record
class GpuState:
    """What event lines have done to one GPU."""

    lost: bool = False
    retired_pages_pending: bool = False
    remapped_rows_pending: bool = False
    recovery_action: int = 0


class World:
    """The node, its GPUs' runtime state and the live event sets. `calls` are the NVML calls
    the simulator has, which a node file's `notSupported` may name."""

    def __init__(self, node: str, events_path: str | None, calls: Collection[str]) -> None:
        self.lock = threading.RLock()
        self._calls = frozenset(calls)
        self._path = resolve_node_path(node)
        self._stamp = self._file_stamp()
        self._use(self._read(read_node_once))  # the host files' read of it, when unchanged
        self._events = EventFile(Path(events_path)) if events_path else None
        self._watch = EventFileWatch(Path(events_path)) if events_path else None
        self._states: dict[str, GpuState] = {}
        self.event_sets: list[SimEventSet] = []

    # --- the node file ------------------------------------------------------------------------

    def _read(self, read: Callable[[Path], Node] = read_node) -> Node:
        node = read(self._path)
        for position, gpu in enumerate(node.gpus):
            unknown = sorted(gpu.not_supported - self._calls)
            if unknown:
                path = f"gpus[{position}].notSupported"
                raise ConfigError(path, f"no NVML call named {', '.join(unknown)}")
        return node

    def _use(self, node: Node) -> None:
        self.node = node
        self.gpus = {gpu.uuid: gpu for gpu in node.gpus}  # by UUID: every NVML call looks one up

    def _file_stamp(self) -> tuple[int, int]:
        try:
            stat = self._path.stat()
        except OSError:
            return (0, 0)
        return (stat.st_mtime_ns, stat.st_size)

    def reload(self) -> None:
        """Re-read the node file now; raises ConfigError when it is invalid."""
        with self.lock:
            stamp = self._file_stamp()
            self._use(self._read())
            self._stamp = stamp

    def reload_if_changed(self) -> None:
        """Re-read the node file if it changed; an invalid one is logged and the old kept."""
        with self.lock:
            if self._file_stamp() == self._stamp:
                return
            try:
                self.reload()
            except ConfigError as err:
                self._stamp = self._file_stamp()
                log_event(
                    logger,
                    "sim.node.invalid",
                    logging.WARNING,
                    path=str(self._path),
                    error=str(err),
                )

    # --- lookups ------------------------------------------------------------------------------

    def state(self, gpu_uuid: str) -> GpuState:
        state = self._states.get(gpu_uuid)
        if state is None:  # made once: every NVML call of the simulator asks
            state = self._states[gpu_uuid] = GpuState()
        return state

    def owner(self, uuid: str) -> tuple[SimGpu, SimMig | None] | None:
        """The GPU with this UUID, or the GPU and MIG device for a MIG UUID."""
        for gpu in self.node.gpus:
            if gpu.uuid == uuid:
                return gpu, None
            for mig in gpu.mig_devices:
                if mig.uuid == uuid:
                    return gpu, mig
        return None

    def numa_node(self, pci_bus_id: str) -> int | None:
        """The node file's `numaNode` for the GPU at this PCI address."""
        with self.lock:
            for gpu in self.node.gpus:
                if gpu.pci_bus_id.lower() == pci_bus_id.lower():
                    return gpu.numa_node
        return None

    # --- events -------------------------------------------------------------------------------

    def pump(self) -> None:
        """Apply the lines appended to the events file since the last call."""
        events = self._events
        if events is None or not events.changed():  # the common case, once per NVML call
            return
        with self.lock:
            for event in events.read():
                self._apply(event)

    def watch_events(self) -> None:
        """Start noticing writes to the events file (idempotent); call before `pump`, so no
        line can slip between a pump and the wait that follows it."""
        if self._watch is not None:
            self._watch.start()

    def wait_for_lines(self, timeout: float) -> None:
        """Sleep until the events file may have been written since the last wait, or `timeout`."""
        if self._watch is None:
            time.sleep(timeout)  # no events file: nothing can arrive
        else:
            self._watch.wait(timeout)

    def stop_watching(self) -> None:
        if self._watch is not None:
            self._watch.stop()

    def _apply(self, event: SimEvent) -> None:
        if event.wait_error is not None:
            for event_set in self.event_sets:
                event_set.wait_error = event.wait_error
        if event.uuid is None:
            return
        owner = self.owner(event.uuid)
        if owner is None:
            log_event(logger, "sim.event.unknown_device", logging.WARNING, uuid=event.uuid)
            return
        gpu, mig = owner
        state = self.state(gpu.uuid)
        for name in ("lost", "retired_pages_pending", "remapped_rows_pending", "recovery_action"):
            value = getattr(event, name)
            if value is not None:
                setattr(state, name, value)
        xid = event.xid
        if xid is None and event.lost:
            xid = _XID_FALLEN_OFF_BUS
        if xid is not None:
            self._deliver(gpu, mig, s.nvmlEventTypeXidCriticalError, xid)
        if event.ecc_type is not None:
            self._deliver(gpu, mig, event.ecc_type, 0)

    def _deliver(self, gpu: SimGpu, mig: SimMig | None, event_type: int, data: int) -> None:
        event = s.EventData(
            device=s.DeviceHandle(gpu.uuid),
            eventType=event_type,
            eventData=data,
            gpuInstanceId=mig.gpu_instance_id if mig else _NO_INSTANCE,
            computeInstanceId=mig.compute_instance_id if mig else _NO_INSTANCE,
        )
        for event_set in self.event_sets:
            if not event_set.masks.get(gpu.uuid, 0) & event_type:
                continue
            if len(event_set.queue) < MAX_QUEUED:
                event_set.queue.append(event)
                continue
            if event_set.dropped == 0:  # memory stays flat when nobody waits
                log_event(logger, "sim.event.set_full", logging.WARNING, held=MAX_QUEUED)
            event_set.dropped += 1
