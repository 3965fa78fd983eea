"""A small Kubernetes API client on asyncio streams and the standard library, for `serve`.

`serve` reaches the API server only for its own Node (the per-node config label, GPU node
labels) and its image carries no Kubernetes client library, so this speaks HTTP/1.1 itself:
one request per connection, JSON bodies, a watch read line by line as the server streams it.
Every wait is cancellable, so SIGTERM never waits on the API server.

Credentials come from a kubeconfig (`--kubeconfig`: server, CA, bearer token or token file,
client certificate, insecure-skip-tls-verify) or from the pod's service account, whose token is
read again at every request because projected tokens rotate. Every failure leaves as
`ApiError`: `status` is the HTTP status, 0 when no answer came.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import ssl
import tempfile
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from deviceplugin import __version__
from deviceplugin.model.errors import ConfigError, DevicePluginError
from deviceplugin.model.jsonobject import JsonObject, json_object
from deviceplugin.model.record import record
from deviceplugin.model.yamlimport import yaml

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
CONNECT_SECONDS = 10.0
REQUEST_SECONDS = 30.0
_MAX_HEADER_LINES = 200


class ApiError(DevicePluginError):
    """An API call failed: `status` is the HTTP status, 0 when no answer came."""

    def __init__(self, message: str, status: int = 0) -> None:
        self.status = status
        super().__init__(message)


@record(frozen=True)
class Credentials:
    """Where the API server is and how to prove who we are."""

    server: str
    ca_file: str | None = None
    ca_data: bytes | None = None
    insecure: bool = False
    token: str | None = None
    token_file: str | None = None
    cert_data: bytes | None = None  # PEM client certificate and key, for mutual TLS
    key_data: bytes | None = None

    def bearer(self) -> str | None:
        """The token to send: a token file is read at every request (rotated tokens)."""
        if self.token_file:
            try:
                return Path(self.token_file).read_text().strip()
            except OSError as exc:
                raise ApiError(f"cannot read token {self.token_file}: {exc.strerror}") from None
        return self.token


def in_cluster(env: Mapping[str, str], account: Path = SERVICE_ACCOUNT) -> Credentials:
    """The pod's service account. Raises ConfigError when this is not a pod with one."""
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT", "443")
    token = account / "token"
    if not host or not token.is_file():
        raise ConfigError(
            "kubeconfig",
            "no --kubeconfig and not in a pod with a service account token"
            f" (KUBERNETES_SERVICE_HOST unset or {token} missing)",
        )
    server_host = f"[{host}]" if ":" in host else host
    return Credentials(
        server=f"https://{server_host}:{port}",
        ca_file=str(account / "ca.crt"),
        token_file=str(token),
    )


def from_kubeconfig(path: str) -> Credentials:
    """The current context of a kubeconfig file. Raises ConfigError naming what is wrong."""
    try:
        document = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError("kubeconfig", f"cannot read {path}: {exc}") from None
    if not isinstance(document, dict):
        raise ConfigError("kubeconfig", f"{path} is not a kubeconfig")
    base = Path(path).parent

    def named(kind: str, name: object) -> dict[str, Any]:
        for entry in document.get(f"{kind}s") or []:
            if isinstance(entry, dict) and entry.get("name") == name:
                found = entry.get(kind)
                return found if isinstance(found, dict) else {}
        raise ConfigError("kubeconfig", f"{path}: no {kind} named {name!r}")

    context = named("context", document.get("current-context"))
    cluster = named("cluster", context.get("cluster"))
    user = named("user", context.get("user")) if context.get("user") else {}
    if "exec" in user or "auth-provider" in user:
        raise ConfigError("kubeconfig", f"{path}: exec and auth-provider users are not supported")
    server = cluster.get("server")
    if not isinstance(server, str) or urlsplit(server).scheme not in ("http", "https"):
        raise ConfigError("kubeconfig", f"{path}: the cluster has no http(s) server")

    def data(entry: dict[str, Any], key: str) -> bytes | None:
        if entry.get(f"{key}-data"):
            return base64.b64decode(entry[f"{key}-data"])
        if entry.get(key):
            try:
                return (base / str(entry[key])).read_bytes()
            except OSError as exc:
                raise ConfigError("kubeconfig", f"{path}: {key}: {exc}") from None
        return None

    token_file = user.get("tokenFile")
    return Credentials(
        server=server.rstrip("/"),
        ca_data=data(cluster, "certificate-authority"),
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        token=user.get("token"),
        token_file=str(base / token_file) if token_file else None,
        cert_data=data(user, "client-certificate"),
        key_data=data(user, "client-key"),
    )


def credentials(kubeconfig: str | None, env: Mapping[str, str]) -> Credentials:
    """`--kubeconfig` when given, else the pod's service account."""
    return from_kubeconfig(kubeconfig) if kubeconfig else in_cluster(env)


def _tls(creds: Credentials) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=creds.ca_file)
    # Python 3.13 turns on RFC 5280 strictness that Go's clients do not apply: cluster CAs that
    # kubectl and the kubelet accept (no Authority Key Identifier, say) must work here too.
    context.verify_flags &= ~ssl.VERIFY_X509_STRICT
    if creds.ca_data:
        context.load_verify_locations(cadata=creds.ca_data.decode())
    if creds.insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if creds.cert_data and creds.key_data:
        # ssl loads a client certificate from files only: a private one, gone once loaded.
        with tempfile.TemporaryDirectory() as private:
            chain = Path(private) / "client.pem"
            chain.touch(mode=0o600)
            chain.write_bytes(creds.cert_data + b"\n" + creds.key_data)
            context.load_cert_chain(chain)
    return context


class ApiClient:
    """Requests to one API server with one set of credentials."""

    def __init__(self, creds: Credentials) -> None:
        self._creds = creds
        parts = urlsplit(creds.server)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or ""
        self._port = parts.port or (443 if self._https else 80)
        self._netloc = parts.netloc
        self._tls = _tls(creds) if self._https else None

    @property
    def server(self) -> str:
        return self._creds.server

    async def request(
        self,
        method: str,
        path: str,
        body: JsonObject | None = None,
        content_type: str = "application/json",
    ) -> JsonObject:
        """One call; the answer's JSON object. Raises ApiError for no answer or a non-2xx one."""
        try:
            async with asyncio.timeout(REQUEST_SECONDS):
                async with self._exchange(method, path, body, content_type) as (status, chunks):
                    data = b"".join([chunk async for chunk in chunks])
        except TimeoutError:
            raise ApiError(f"{method} {path}: no answer in {REQUEST_SECONDS:g} s") from None
        answer = json_object(data)
        if not 200 <= status <= 299:
            message = answer.get("message") or data[:200].decode(errors="replace")
            raise ApiError(f"{method} {path}: {status} {message}", status)
        return answer

    async def watch(self, path: str) -> AsyncIterator[JsonObject]:
        """The events of a watch (`path` with `watch=1`), one JSON object each, until the server
        ends it. Raises ApiError for no answer or a non-2xx one."""
        async with self._exchange("GET", path, None, "") as (status, chunks):
            if status != 200:
                data = b"".join([chunk async for chunk in chunks])
                message = json_object(data).get("message") or data[:200].decode(errors="replace")
                raise ApiError(f"watch {path}: {status} {message}", status)
            pending = b""
            async for chunk in chunks:
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield json_object(line)

    @contextlib.asynccontextmanager
    async def _exchange(
        self, method: str, path: str, body: JsonObject | None, content_type: str
    ) -> AsyncIterator[tuple[int, AsyncIterator[bytes]]]:
        """Send one request on a new connection; yield the status and the body's chunks."""
        try:
            async with asyncio.timeout(CONNECT_SECONDS):
                reader, writer = await asyncio.open_connection(
                    self._host,
                    self._port,
                    ssl=self._tls,
                    server_hostname=self._host if self._tls else None,
                )
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            raise ApiError(f"API server {self.server} unreachable: {exc!r}") from None
        try:
            writer.write(self._head(method, path, body, content_type))
            status, headers = await _read_head(reader)
            yield status, _read_body(reader, headers)
        except (OSError, ssl.SSLError, asyncio.IncompleteReadError, ValueError) as exc:
            raise ApiError(f"API server {self.server}: connection lost: {exc!r}") from None
        finally:
            writer.close()
            with contextlib.suppress(OSError, ssl.SSLError):
                await writer.wait_closed()

    def _head(self, method: str, path: str, body: JsonObject | None, content_type: str) -> bytes:
        lines = [
            f"{method} {path} HTTP/1.1",
            f"Host: {self._netloc}",
            "Accept: application/json",
            f"User-Agent: deviceplugin/{__version__}",
            "Connection: close",
        ]
        token = self._creds.bearer()
        if token:
            lines.append(f"Authorization: Bearer {token}")
        payload = b""
        if body is not None:
            payload = json.dumps(body).encode()
            lines += [f"Content-Type: {content_type}", f"Content-Length: {len(payload)}"]
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + payload


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    status_line = (await reader.readline()).decode("latin-1")
    parts = status_line.split()
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise ValueError(f"not an HTTP answer: {status_line[:80]!r}")
    headers: dict[str, str] = {}
    for _ in range(_MAX_HEADER_LINES):
        line = (await reader.readline()).decode("latin-1").strip()
        if not line:
            return int(parts[1]), headers
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    raise ValueError("too many header lines")


async def _read_body(
    reader: asyncio.StreamReader, headers: Mapping[str, str]
) -> AsyncIterator[bytes]:
    """The body as it arrives: chunked, sized by Content-Length, or up to the connection's end."""
    if headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                return
            yield await reader.readexactly(size)
            await reader.readexactly(2)  # the CRLF after each chunk
    elif "content-length" in headers:
        yield await reader.readexactly(int(headers["content-length"]))
    else:
        while chunk := await reader.read(65536):
            yield chunk


def node_path(name: str) -> str:
    return f"/api/v1/nodes/{quote(name, safe='')}"
