"""`--http-address`: /healthz, /readyz, /metrics and /status, served on the loop of the plugin
(or the DRA driver) they describe.

A small asyncio HTTP/1.1 server rather than prometheus-client's threaded one: an answer from
/healthz then proves that the loop running the gRPC servers is turning, and every handler reads
the supervisor's state on that loop without locks. One request per connection
(`Connection: close`); the request head is capped at MAX_HEAD bytes and READ_TIMEOUT seconds;
anything malformed gets a 4xx and the connection closes. The kubelet's pod assignments are read
when /metrics or /status is asked for, at most once per POD_REFRESH_SECONDS.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

from deviceplugin.model.assignments import PodDevices
from deviceplugin.model.config import Config
from deviceplugin.model.errors import ConfigError
from deviceplugin.model.log import log_event, log_exception
from deviceplugin.model.record import record
from deviceplugin.ops.drametrics import DraMetrics
from deviceplugin.ops.drastatus import DraStatus
from deviceplugin.ops.metrics import Metrics
from deviceplugin.ops.snapshot import build_snapshot
from deviceplugin.ops.status import Status

logger = logging.getLogger(__name__)

MAX_HEAD = 8192
READ_TIMEOUT = 5.0
POD_REFRESH_SECONDS = 1.0
METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TEXT_TYPE = "text/plain; charset=utf-8"
JSON_TYPE = "application/json"
_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


PodReader = Callable[[Path], Awaitable[tuple[PodDevices | None, str]]]


class PluginView(Protocol):
    """What the endpoints read of the running plugin (the supervisor provides it)."""

    metrics: Metrics

    def status(self) -> Status: ...

    @property
    def config(self) -> Config: ...


@record(frozen=True)
class Response:
    status: int
    body: bytes
    content_type: str = TEXT_TYPE


def _text(status: int, text: str) -> Response:
    return Response(status, (text + "\n").encode())


def parse_address(address: str) -> tuple[str | None, int]:
    """`HOST:PORT`, `[IPv6]:PORT`, or `:PORT` for every interface. Raises ConfigError."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not port_text.isdigit() or int(port_text) > 65535:
        raise ConfigError("--http-address", f"expected HOST:PORT, got {address!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return (host or None), int(port_text)


class Endpoints(Protocol):
    """What /readyz, /metrics and /status answer: the device plugin's or the DRA driver's."""

    def not_ready(self) -> list[str]: ...

    async def metrics(self) -> bytes: ...

    async def status(self) -> dict[str, Any]: ...


class PluginEndpoints:
    """The device plugin's answers, from the supervisor and, for /metrics and /status, from
    the kubelet's pod assignments (`read_pods`, given the pod-resources socket)."""

    def __init__(self, supervisor: PluginView, pods_socket: Path, read_pods: PodReader) -> None:
        self._supervisor = supervisor
        self._pods_socket = pods_socket
        self._read_pods_from = read_pods
        self._pods: tuple[PodDevices | None, str] = (None, "")
        self._pods_at: float | None = None
        self._pods_lock = asyncio.Lock()

    def not_ready(self) -> list[str]:
        return self._supervisor.status().not_ready

    async def metrics(self) -> bytes:
        pods, _ = await self._read_pods()
        metrics = self._supervisor.metrics
        metrics.set_allocated(pods, self._supervisor.status().resources)
        return metrics.render()

    async def status(self) -> dict[str, Any]:
        pods, note = await self._read_pods()
        status = self._supervisor.status()
        return build_snapshot(
            status.resources,
            self._supervisor.config,
            status.core.config_source,
            status=status,
            pods_socket=self._pods_socket,
            pods=pods,
            pods_note=note,
        )

    async def _read_pods(self) -> tuple[PodDevices | None, str]:
        """The kubelet's assignments, asked for at most once per POD_REFRESH_SECONDS however
        often Prometheus and probes call, so scrapes cannot load the kubelet."""
        loop = asyncio.get_running_loop()
        async with self._pods_lock:
            if self._pods_at is not None and loop.time() - self._pods_at < POD_REFRESH_SECONDS:
                return self._pods
            previous_note = self._pods[1]
            self._pods = await self._read_pods_from(self._pods_socket)
            self._pods_at = loop.time()
            note = self._pods[1]
            if note and note != previous_note:
                log_event(logger, "pods.unknown", detail=note)
            return self._pods


class DraView(Protocol):
    """What the endpoints read of a running DRA driver (`dra.driver.DraDriver` provides it)."""

    metrics: DraMetrics

    def status(self) -> DraStatus: ...


class DraEndpoints:
    """The DRA driver's answers; its gauges are set from its status at each scrape."""

    def __init__(self, driver: DraView) -> None:
        self._driver = driver

    def not_ready(self) -> list[str]:
        return self._driver.status().not_ready

    async def metrics(self) -> bytes:
        self._driver.metrics.set_status(self._driver.status())
        return self._driver.metrics.render()

    async def status(self) -> dict[str, Any]:
        return self._driver.status().document()


class EndpointServer:
    """The HTTP endpoints of one running plugin or driver, answered by `endpoints`."""

    def __init__(self, address: str, endpoints: Endpoints) -> None:
        self._host, self._requested_port = parse_address(address)
        self._endpoints = endpoints
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()

    @property
    def port(self) -> int | None:
        """The bound port (useful with port 0); None until started."""
        if self._server is None or not self._server.sockets:
            return None
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def start(self) -> None:
        """Listen. Raises ConfigError when the address cannot be bound."""
        try:
            self._server = await asyncio.start_server(
                self._connection, self._host, self._requested_port, limit=MAX_HEAD
            )
        except OSError as exc:
            raise ConfigError(
                "--http-address",
                f"cannot listen on {self._host or '*'}:{self._requested_port}: "
                f"{exc.strerror or exc}",
            ) from None
        log_event(logger, "http.listening", host=self._host or "*", port=self.port)

    async def stop(self) -> None:
        """Stop listening and close open connections."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for writer in list(self._open):
            writer.close()
        await server.wait_closed()

    # --- connections ------------------------------------------------------------------------------

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._open.add(writer)
        try:
            response, head_only = await self._answer(reader)
            if response is not None:
                writer.write(_encode(response, head_only))
                await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            self._open.discard(writer)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader) -> tuple[Response | None, bool]:
        """Read one request head and route it; (None, _) when there is nothing to answer."""
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT)
        except asyncio.LimitOverrunError:
            return _text(431, "request head too large"), False
        except asyncio.IncompleteReadError:
            return None, False
        parts = head.split(b"\r\n", 1)[0].split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
            return _text(400, "bad request line"), False
        method, target = parts[0], parts[1].split(b"?", 1)[0]
        if method not in (b"GET", b"HEAD"):
            return _text(405, "only GET and HEAD"), False
        try:
            return await self._route(target.decode("ascii")), method == b"HEAD"
        except UnicodeDecodeError:
            return _text(400, "bad request target"), False
        except Exception:
            path = target.decode("ascii", "replace")
            log_exception(logger, "http.failed", path=path)
            return _text(500, "internal error"), False

    async def _route(self, path: str) -> Response:
        if path == "/healthz":
            return _text(200, "ok")
        if path == "/readyz":
            reasons = self._endpoints.not_ready()
            return _text(503, "; ".join(reasons)) if reasons else _text(200, "ready")
        if path == "/metrics":
            return Response(200, await self._endpoints.metrics(), METRICS_TYPE)
        if path == "/status":
            document = await self._endpoints.status()
            return Response(200, json.dumps(document, indent=2).encode() + b"\n", JSON_TYPE)
        return _text(404, "not found; try /healthz, /readyz, /metrics or /status")


class HttpServer(EndpointServer):
    """The device plugin's endpoints (`serve --http-address`). `read_pods` asks the kubelet
    who holds which device, given the pod-resources socket."""

    def __init__(
        self, address: str, supervisor: PluginView, pods_socket: Path, *, read_pods: PodReader
    ) -> None:
        super().__init__(address, PluginEndpoints(supervisor, pods_socket, read_pods))


def _encode(response: Response, head_only: bool) -> bytes:
    head = (
        f"HTTP/1.1 {response.status} {_REASONS.get(response.status, '')}\r\n"
        f"Content-Type: {response.content_type}\r\n"
        f"Content-Length: {len(response.body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    return head if head_only else head + response.body
