"""The one Kubernetes client (`runtime.kubeclient`, lightkube underneath), against raw TCP
servers here: a deadline on every call (a server that accepts and never answers, one that
trickles), one error type with the server's status and message, watches that resume and end
on 410, paced watch requests, the token file read again on 401, kubeconfig and in-cluster
config, and TLS verified against the cluster's CA."""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import ssl
import subprocess
import time
from pathlib import Path

import pytest

from deviceplugin.model.errors import ConfigError
from deviceplugin.runtime import kubeclient
from deviceplugin.runtime.kubeclient import NODES, ConflictError, KubeError, connect

OK_NODE = b'{"kind":"Node","apiVersion":"v1","metadata":{"name":"n","resourceVersion":"5"}}'


def answer(status: str, body: bytes, content_type: str = "application/json") -> list[bytes]:
    head = f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
    return [head.encode() + b"Content-Length: %d\r\n\r\n" % len(body) + body]


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def event(kind: str, version: str) -> bytes:
    item = {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {"name": "n", "resourceVersion": version},
    }
    return json.dumps({"type": kind, "object": item}).encode() + b"\n"


class RawServer:
    """Answers each connection's requests with the next canned responses, in order; keeps
    every request head and when it came. No response left: the request is held for ever."""

    def __init__(self, *responses: list[bytes]) -> None:
        self.responses = list(responses)
        self.heads: list[str] = []
        self.times: list[float] = []
        self.server: asyncio.Server | None = None
        self.tls: ssl.SSLContext | None = None

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.tls)
        port = self.server.sockets[0].getsockname()[1]
        scheme = "https" if self.tls else "http"
        return f"{scheme}://127.0.0.1:{port}"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.heads.append(head.decode())
                self.times.append(time.monotonic())
                length = [
                    h for h in head.decode().split("\r\n") if h.lower().startswith("content-length")
                ]
                if length:
                    await reader.readexactly(int(length[0].split(":")[1]))
                if not self.responses:
                    await asyncio.sleep(3600)  # accepted, never answered
                for part in self.responses.pop(0):
                    writer.write(part)
                    await writer.drain()
                    await asyncio.sleep(0.01)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


def test_a_server_that_never_answers_fails_the_call_within_its_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kubeclient, "CALL_SECONDS", 0.5)

    async def body() -> tuple[KubeError, float, str | None]:
        async with RawServer() as url:
            client = connect(None, {}, server=url)
            began = time.monotonic()
            with pytest.raises(KubeError) as caught:
                await client.get(NODES, "n")
            took = time.monotonic() - began
            unreachable = client.unreachable
            await client.close()
        return caught.value, took, unreachable

    error, took, unreachable = asyncio.run(body())
    assert error.status == 0 and "did not answer get Node n in time" in str(error)
    assert took < 2.0
    assert unreachable == str(error)


def test_an_answer_clears_unreachable_and_comes_back_as_a_dict() -> None:
    async def body() -> tuple[object, str | None]:
        async with RawServer(answer("200 OK", OK_NODE)) as url:
            client = connect(None, {}, server=url)
            client.unreachable = "earlier"
            node = await client.get(NODES, "n")
            await client.close()
        return node, client.unreachable

    node, unreachable = asyncio.run(body())
    assert node == json.loads(OK_NODE) and type(node) is dict
    assert unreachable is None


@pytest.mark.parametrize(
    ("status", "kind"), [("403 Forbidden", KubeError), ("409 Conflict", ConflictError)]
)
def test_a_refusal_carries_the_status_and_the_servers_message(
    status: str, kind: type[KubeError]
) -> None:
    code = int(status.split()[0])
    refusal = {
        "kind": "Status",
        "status": "Failure",
        "code": code,
        "message": 'nodes "n" is forbidden',
    }

    async def body() -> KubeError:
        async with RawServer(answer(status, json.dumps(refusal).encode())) as url:
            client = connect(None, {}, server=url)
            with pytest.raises(KubeError) as caught:
                await client.merge_patch(NODES, "n", {"metadata": {"labels": {"a": "b"}}})
            await client.close()
        return caught.value

    error = asyncio.run(body())
    assert type(error) is kind
    assert error.status == code and 'nodes "n" is forbidden' in str(error)


def test_an_answer_that_is_not_json_is_a_kube_error_with_its_status() -> None:
    async def body() -> KubeError:
        async with RawServer(answer("502 Bad Gateway", b"<html>", "text/html")) as url:
            client = connect(None, {}, server=url)
            with pytest.raises(KubeError) as caught:
                await client.get(NODES, "n")
            await client.close()
        return caught.value

    assert asyncio.run(body()).status == 502


def test_no_server_is_a_kube_error_with_no_status() -> None:
    async def body() -> tuple[KubeError, str | None]:
        async with RawServer() as url:
            pass  # closed again: nobody listens on that port now
        client = connect(None, {}, server=url)
        with pytest.raises(KubeError) as caught:
            await client.get(NODES, "n")
        await client.close()
        return caught.value, client.unreachable

    error, unreachable = asyncio.run(body())
    assert error.status == 0 and "unreachable" in str(error) and unreachable


def test_a_watch_resumes_where_the_server_ended_it_and_paces_its_requests() -> None:
    first = event("ADDED", "6") + event("MODIFIED", "7")
    stream = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n"
    )
    ended = [stream, chunk(first[:9]), chunk(first[9:]), b"0\r\n\r\n"]
    resumed = [stream, chunk(event("DELETED", "8")), b"0\r\n\r\n"]
    server = RawServer(ended, resumed)

    async def body() -> list[tuple[str, str]]:
        async with server as url:
            client = connect(None, {}, server=url)
            seen = []
            async for kind, node in client.watch(NODES, {"metadata.name": "n"}, "5"):
                seen.append((kind, node["metadata"]["resourceVersion"]))
                if len(seen) == 3:
                    break
            await client.close()
        return seen

    assert asyncio.run(body()) == [("ADDED", "6"), ("MODIFIED", "7"), ("DELETED", "8")]
    assert "resourceVersion=5" in server.heads[0] and "resourceVersion=7" in server.heads[1]
    assert "fieldSelector=metadata.name%3Dn" in server.heads[0]
    assert server.times[1] - server.times[0] >= kubeclient.SHORTEST_WATCH_SECONDS * 0.9


def test_a_watch_from_a_version_too_old_ends_with_410() -> None:
    gone = {
        "kind": "Status",
        "code": 410,
        "reason": "Expired",
        "message": "too old resource version",
    }
    line = json.dumps({"type": "ERROR", "object": gone}).encode() + b"\n"
    stream = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n"
    )

    async def body() -> KubeError:
        async with RawServer([stream, chunk(line), b"0\r\n\r\n"]) as url:
            client = connect(None, {}, server=url)
            with pytest.raises(KubeError) as caught:
                async for _ in client.watch(NODES, {"metadata.name": "n"}, "1"):
                    pass
            await client.close()
        return caught.value

    error = asyncio.run(body())
    assert error.status == 410 and "too old resource version" in str(error)


def write_kubeconfig(
    path: Path, server: str, user: dict[str, object], cluster: dict[str, object]
) -> Path:
    document = {
        "current-context": "c",
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        "clusters": [{"name": "k", "cluster": {"server": server, **cluster}}],
        "users": [{"name": "u", "user": user}],
    }
    path.write_text(json.dumps(document))
    return path


def test_the_token_file_is_read_again_when_the_server_answers_401(tmp_path: Path) -> None:
    token = tmp_path / "token"
    unauthorized = {"kind": "Status", "code": 401, "message": "Unauthorized"}
    server = RawServer(
        answer("200 OK", OK_NODE),
        answer("401 Unauthorized", json.dumps(unauthorized).encode()),
        answer("200 OK", OK_NODE),
    )

    async def body() -> None:
        async with server as url:
            path = write_kubeconfig(tmp_path / "kubeconfig", url, {"tokenFile": str(token)}, {})
            token.write_text("first\n")
            client = connect(str(path), {})
            await client.get(NODES, "n")
            token.write_text("rotated\n")  # the kubelet rotated the projected token
            await client.get(NODES, "n")
            await client.close()

    asyncio.run(body())
    assert "Authorization: Bearer first" in server.heads[0]
    assert "Authorization: Bearer first" in server.heads[1]
    assert "Authorization: Bearer rotated" in server.heads[2]


@pytest.mark.parametrize(
    ("document", "fragment"),
    [
        ("[]", "cannot load Kubernetes client config"),
        ('{"current-context": "x"}', "cannot"),
        ("{not yaml", "cannot load Kubernetes client config"),
    ],
)
def test_a_kubeconfig_that_cannot_work_is_refused_naming_why(
    tmp_path: Path, document: str, fragment: str
) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(document)
    with pytest.raises(ConfigError, match=fragment) as caught:
        connect(str(path), {})
    assert caught.value.path == "kubeconfig"


def test_a_missing_kubeconfig_is_refused_naming_the_file() -> None:
    with pytest.raises(ConfigError, match="/nonexistent/kubeconfig"):
        connect("/nonexistent/kubeconfig", {})


def test_in_cluster_needs_the_service_and_a_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kubeclient, "SERVICE_ACCOUNT", tmp_path)
    with pytest.raises(ConfigError, match="not in a pod with a service account token"):
        connect(None, {})
    with pytest.raises(ConfigError, match="not in a pod with a service account token"):
        connect(None, {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"})


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 that is its own CA, and its key."""
    cert, key = directory / "server.crt", directory / "server.key"
    request = ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
    names = ["-subj", "/CN=apiserver", "-addext", "subjectAltName=IP:127.0.0.1"]
    files = ["-keyout", str(key), "-out", str(cert)]
    subprocess.run(["openssl", *request, *names, *files], check=True, capture_output=True)
    return cert, key


@pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl to make certificates")
def test_https_is_verified_against_the_clusters_ca(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    served.load_cert_chain(cert, key)
    server = RawServer(answer("200 OK", OK_NODE), answer("200 OK", OK_NODE))
    server.tls = served
    ca = base64.b64encode(cert.read_bytes()).decode()

    async def body() -> tuple[dict[str, object], KubeError]:
        async with server as url:
            trusted = connect(
                str(
                    write_kubeconfig(
                        tmp_path / "trusted",
                        url,
                        {"token": "t"},
                        {"certificate-authority-data": ca},
                    )
                ),
                {},
            )
            node = await trusted.get(NODES, "n")
            await trusted.close()
            stranger = connect(
                str(write_kubeconfig(tmp_path / "stranger", url, {"token": "t"}, {})), {}
            )
            with pytest.raises(KubeError) as caught:
                await stranger.get(NODES, "n")
            await stranger.close()
        return node, caught.value

    node, refused = asyncio.run(body())
    assert node["metadata"] == {"name": "n", "resourceVersion": "5"}
    assert refused.status == 0 and "CERTIFICATE_VERIFY_FAILED" in str(refused)


def test_a_watch_deadline_never_cancels_the_callers_handling_of_an_event(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kubeclient, "WATCH_SECONDS", 0.2)
    monkeypatch.setattr(kubeclient, "WATCH_GRACE_SECONDS", 0)
    stream = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n"
    )
    server = RawServer([stream, chunk(event("ADDED", "6"))])  # then the stream stays open

    async def body() -> list[str]:
        handled = []
        async with server as url:
            client = connect(None, {}, server=url)
            async for kind, _ in client.watch(NODES, {"metadata.name": "n"}, "5"):
                await asyncio.sleep(0.4)  # handling outlasts the watch's time: not cancelled
                handled.append(kind)
            await client.close()
        return handled

    assert asyncio.run(asyncio.wait_for(body(), 5)) == ["ADDED"]
