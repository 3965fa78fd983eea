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
read, each once; a line is read once it ends with a newline. A malformed line is logged as
`sim.event.malformed` and skipped, one longer than MAX_LINE bytes as `sim.event.too_long`; a
file replaced (another inode: an editor, `sed -i`, logrotate) or truncated is read again from
its start. The C library (`native/eventline.c`) accepts and refuses exactly the same lines
(tests/data/event-lines.json). The file must be a regular file: it is opened without blocking
and read in bounded chunks, never past the size it had when opened.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import select
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from deviceplugin.model.log import log_event
from deviceplugin.model.record import record
from deviceplugin.node.inotify import IN_CREATE, IN_MODIFY, IN_MOVED_TO, add_watch, open_inotify
from deviceplugin.node.regularfile import open_regular
from deviceplugin.sim.structs import error_code

logger = logging.getLogger(__name__)

_ECC = {"single": 0x1, "double": 0x2}
MAX_LINE = 4096  # bytes, as native/sim.h's SIM_MAX_LINE
MAX_READ = 1 << 20  # bytes read per pump; the rest waits for the next
_MAX_COUNT = 0xFFFFFFFF
_MAX_WAIT_ERROR = 999
_UUID_BYTES = 96  # NVML_DEVICE_UUID_V2_BUFFER_SIZE
_BLANK = re.compile(rb"[ \t\r]*")
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


def parse_line(line: bytes | str) -> SimEvent:
    """One line (without its newline) -> SimEvent. Raises ValueError saying what is wrong."""
    raw = line.encode("utf-8", errors="surrogatepass") if isinstance(line, str) else line
    try:
        data = json.loads(
            raw.decode("utf-8"), object_pairs_hook=_unique, parse_constant=_no_constant
        )
    except (UnicodeDecodeError, RecursionError, ValueError) as err:
        raise ValueError(f"not JSON: {err}") from None
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    unknown = set(data) - {"uuid", "xid", "ecc", "recoveryAction", "waitError", *_BOOLEANS}
    if unknown:
        raise ValueError(f"unknown keys {sorted(unknown)}")
    fields: dict[str, Any] = {}
    uuid = data.get("uuid")
    if "uuid" in data and not (isinstance(uuid, str) and uuid.startswith(("GPU-", "MIG-"))):
        raise ValueError("uuid must be a GPU- or MIG- UUID")
    if uuid is not None and len(uuid.encode()) >= _UUID_BYTES:
        raise ValueError("uuid is too long")
    fields["uuid"] = uuid
    for key, name in (("xid", "xid"), ("recoveryAction", "recovery_action")):
        if key in data:
            fields[name] = _count(data[key], key)
    for key, name in _BOOLEANS.items():
        if key in data:
            if not isinstance(data[key], bool):
                raise ValueError(f"{key} must be true or false")
            fields[name] = data[key]
    if "ecc" in data:
        if not isinstance(data["ecc"], str) or data["ecc"] not in _ECC:
            raise ValueError("ecc must be 'single' or 'double'")
        fields["ecc_type"] = _ECC[data["ecc"]]
    if "waitError" in data:
        fields["wait_error"] = _wait_error(data["waitError"])
    if len(fields) == 1:
        raise ValueError("says nothing to do")
    if uuid is None and set(fields) != {"uuid", "wait_error"}:
        raise ValueError("needs a uuid")
    return SimEvent(**fields)


def is_blank(raw: bytes) -> bool:
    """A line of JSON blanks only, skipped without a word."""
    return _BLANK.fullmatch(raw) is not None


def _unique(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """An object's members; a repeated name, or a NUL or lone surrogate in any string, is
    refused (the C reader cannot hold them, so neither reader takes them)."""
    result: dict[str, object] = {}
    for key, value in pairs:
        for text in (key, value) if isinstance(value, str) else (key,):
            if "\0" in text or not _encodable(text):
                raise ValueError("a NUL or a lone surrogate in a string")
        if key in result:
            raise ValueError(f"duplicate key {key[:40]!r}")
        result[key] = value
    return result


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def _count(value: object, key: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= _MAX_COUNT:
        raise ValueError(f"{key} must be an integer from 0 to 2^32-1")
    return value


def _wait_error(value: object) -> int:
    code = error_code(value) if isinstance(value, str) else value
    if not isinstance(code, int) or isinstance(code, bool) or not 0 < code <= _MAX_WAIT_ERROR:
        raise ValueError(f"waitError {str(value)[:40]!r} names no NVML error")
    return code


class EventFile:
    """Reads the lines appended to one file since the reader started, each once."""

    def __init__(self, path: Path) -> None:
        self._path = os.fspath(path)  # a str: it is stat'ed at every simulated NVML call
        stamp = self._stamp()
        self._inode = stamp[0]
        self._offset = stamp[1]
        self._partial = bytearray()
        self._overlong = False
        self._unreadable = ""

    def _stamp(self) -> tuple[tuple[int, int] | None, int]:
        try:
            info = os.stat(self._path)
        except OSError:
            return None, 0
        return (info.st_dev, info.st_ino), info.st_size

    def changed(self) -> bool:
        """Whether the file was written, cut short or replaced since the last read: one stat."""
        inode, size = self._stamp()
        return inode != self._inode or size != self._offset

    def read(self) -> list[SimEvent]:
        """The events in complete lines appended since the last read."""
        try:
            fd, info = open_regular(self._path)
        except OSError as err:
            self._report_unreadable(str(err))
            return []
        self._unreadable = ""
        try:
            if (info.st_dev, info.st_ino) != self._inode:
                self._start_over("sim.event.replaced", (info.st_dev, info.st_ino))
            elif info.st_size < self._offset:
                self._start_over("sim.event.truncated", self._inode)
            want = min(info.st_size - self._offset, MAX_READ)
            chunk = os.pread(fd, want, self._offset) if want > 0 else b""
        finally:
            os.close(fd)
        self._offset += len(chunk)
        return self._lines(chunk)

    def _start_over(self, event: str, inode: tuple[int, int] | None) -> None:
        log_event(logger, event, logging.WARNING, path=self._path, action="reading from its start")
        self._inode, self._offset = inode, 0
        self._partial.clear()
        self._overlong = False

    def _report_unreadable(self, reason: str) -> None:
        if reason != self._unreadable:
            log_event(logger, "sim.event.unreadable", logging.WARNING, error=reason)
        self._unreadable = reason

    def _lines(self, chunk: bytes) -> list[SimEvent]:
        events = []
        *ends, rest = chunk.split(b"\n")
        for piece in ends:
            self._take(piece)
            raw, overlong = bytes(self._partial), self._overlong
            self._partial.clear()
            self._overlong = False
            if overlong:
                log_event(
                    logger, "sim.event.too_long", logging.WARNING, start=raw[:80], limit=MAX_LINE
                )
            elif not is_blank(raw):
                try:
                    events.append(parse_line(raw))
                except ValueError as err:
                    shown = raw[:200].decode("utf-8", errors="replace")
                    log_event(
                        logger, "sim.event.malformed", logging.WARNING, line=shown, reason=str(err)
                    )
        self._take(rest)
        return events

    def _take(self, piece: bytes) -> None:
        """Keep at most MAX_LINE bytes of the line being read; more marks it too long."""
        room = MAX_LINE - len(self._partial)
        if len(piece) > room:
            self._overlong = True
        self._partial += piece[: max(room, 0)]


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
