"""The simulated-events file (SPEC section 4): JSON lines appended while the plugin runs.

One object per line. `uuid` names a GPU or MIG device; the other keys say what happens:

    {"uuid": "GPU-...", "xid": 79}                 Xid event on the GPU (GI/CI 0xFFFFFFFF)
    {"uuid": "MIG-...", "xid": 94}                 Xid event on the parent GPU, with the MIG
                                                   device's GI/CI ids
    {"uuid": "GPU-...", "ecc": "double"}           ECC event ("single" or "double")
    {"uuid": "GPU-...", "lost": true}              every later NVML call on the GPU fails with
                                                   GPU_IS_LOST; registered event sets get Xid 79
                                                   (fallen off the bus) unless the line has an xid
    {"uuid": "GPU-...", "lost": false}             the GPU answers again
    {"uuid": "GPU-...", "retiredPagesPending": true}     nvmlDeviceGetRetiredPagesPendingStatus
    {"uuid": "GPU-...", "remappedRowsPending": true}     nvmlDeviceGetRemappedRows isPending
    {"uuid": "GPU-...", "recoveryAction": 1}       NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
    {"waitError": "unknown"}                       the next wait of every event set fails with
                                                   that NVML error (a name such as "unknown",
                                                   "gpuIsLost", or a return code)

Keys combine (state first, then the event). Only lines appended after the reader starts are
read; a line is read once it ends with a newline. A malformed line is logged as
`sim.event.malformed` and skipped; a truncated file is read again from its start.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from deviceplugin.model.log import log_event
from deviceplugin.model.record import record
from deviceplugin.node.inotify import IN_CREATE, IN_MODIFY, IN_MOVED_TO, add_watch, open_inotify
from deviceplugin.sim.structs import error_code

logger = logging.getLogger(__name__)

_ECC = {"single": 0x1, "double": 0x2}
_BOOLEANS = {
    "lost": "lost",
    "retiredPagesPending": "retired_pages_pending",
    "remappedRowsPending": "remapped_rows_pending",
}


@record(frozen=True)
class SimEvent:
    """One parsed line; None fields are not mentioned by the line."""

    uuid: str | None = None
    xid: int | None = None
    ecc_type: int | None = None
    lost: bool | None = None
    retired_pages_pending: bool | None = None
    remapped_rows_pending: bool | None = None
    recovery_action: int | None = None
    wait_error: int | None = None


def parse_line(text: str) -> SimEvent:
    """One line -> SimEvent. Raises ValueError saying what is wrong."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"not JSON: {err}") from err
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    unknown = set(data) - {"uuid", "xid", "ecc", "recoveryAction", "waitError", *_BOOLEANS}
    if unknown:
        raise ValueError(f"unknown keys {sorted(unknown)}")
    fields: dict[str, Any] = {}
    uuid = data.get("uuid")
    if uuid is not None and not (isinstance(uuid, str) and uuid.startswith(("GPU-", "MIG-"))):
        raise ValueError("uuid must be a GPU- or MIG- UUID")
    fields["uuid"] = uuid
    for key, name in (("xid", "xid"), ("recoveryAction", "recovery_action")):
        if key in data:
            fields[name] = _count(data[key], key)
    if "ecc" in data:
        if data["ecc"] not in _ECC:
            raise ValueError("ecc must be 'single' or 'double'")
        fields["ecc_type"] = _ECC[data["ecc"]]
    for key, name in _BOOLEANS.items():
        if key in data:
            if not isinstance(data[key], bool):
                raise ValueError(f"{key} must be true or false")
            fields[name] = data[key]
    if "waitError" in data:
        fields["wait_error"] = _wait_error(data["waitError"])
    if len(fields) == 1:
        raise ValueError("says nothing to do")
    if uuid is None and set(fields) != {"uuid", "wait_error"}:
        raise ValueError("needs a uuid")
    return SimEvent(**fields)


def _count(value: object, key: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{key} must be a non-negative integer")
    return value


def _wait_error(value: object) -> int:
    code = error_code(value) if isinstance(value, str) else value
    if not isinstance(code, int) or isinstance(code, bool) or code <= 0:
        raise ValueError(f"waitError {value!r} names no NVML error")
    return code


class EventFile:
    """Reads the lines appended to one file since the reader started."""

    def __init__(self, path: Path) -> None:
        self._path = os.fspath(path)  # a str: it is stat'ed at every simulated NVML call
        self._offset = self._size()
        self._partial = b""

    def _size(self) -> int:
        try:
            return os.stat(self._path).st_size
        except OSError:
            return 0

    def changed(self) -> bool:
        """Whether the file was written (or cut short) since the last read: one stat."""
        return self._size() != self._offset

    def read(self) -> list[SimEvent]:
        """The events in complete lines appended since the last read."""
        size = self._size()
        if size < self._offset:
            log_event(logger, "sim.event.truncated", logging.WARNING, path=self._path)
            self._offset, self._partial = 0, b""
        if size == self._offset:
            return []
        try:
            with open(self._path, "rb") as stream:
                stream.seek(self._offset)
                chunk = stream.read(size - self._offset)
        except OSError:
            return []
        self._offset += len(chunk)
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        events = []
        for raw in lines:
            text = raw.decode("utf-8", errors="replace").strip()
            if not text:
                continue
            try:
                events.append(parse_line(text))
            except ValueError as err:
                log_event(
                    logger, "sim.event.malformed", logging.WARNING, line=text, reason=str(err)
                )
        return events


class EventFileWatch:
    """Lets a simulated event wait sleep until the events file's directory is written, as
    NVML's wait sleeps in the driver, instead of waking every few milliseconds to look.

    Linux inotify through libc, and no thread: the wait blocks on the inotify descriptor, which
    `stop` closes (call it once no wait is running), or the garbage collector with the watch.
    Where inotify is unavailable (no libc symbol, no instance left), `wait` polls every POLL_S.
    """

    POLL_S = 0.005
    _MASK = IN_MODIFY | IN_MOVED_TO | IN_CREATE

    def __init__(self, path: Path) -> None:
        self._directory = path.absolute().parent
        self._guard = threading.Lock()
        self._fd: int | None = None
        self._closer: weakref.finalize[[int], EventFileWatch] | None = None

    def start(self) -> None:
        """Watch the directory (idempotent); a failure means polling, not an error."""
        with self._guard:
            if self._fd is not None:
                return
            try:
                fd = _inotify(self._directory, self._MASK)
            except OSError as err:
                log_event(
                    logger,
                    "sim.event.unwatched",
                    logging.WARNING,
                    path=str(self._directory),
                    error=str(err),
                    fallback=f"polling every {self.POLL_S * 1000:.0f} ms",
                )
                return
            self._fd, self._closer = fd, weakref.finalize(self, os.close, fd)

    def wait(self, timeout: float) -> None:
        """Return after a write in the directory since the last wait, or after `timeout`."""
        fd = self._fd
        if fd is None:
            time.sleep(min(self.POLL_S, timeout))
            return
        ready, _, _ = select.select([fd], [], [], timeout)
        if ready:
            with contextlib.suppress(BlockingIOError):
                os.read(fd, 65536)

    def stop(self) -> None:
        with self._guard:
            closer, self._closer, self._fd = self._closer, None, None
        if closer is not None:
            closer()


def _inotify(directory: Path, mask: int) -> int:
    """A non-blocking inotify descriptor watching `directory`; OSError when there is none."""
    fd = open_inotify()
    try:
        add_watch(fd, directory, mask)
    except OSError:
        os.close(fd)
        raise
    return fd
