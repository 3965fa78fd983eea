"""The standard-library API client `serve` uses for its own Node: credentials from a kubeconfig
or the pod's service account (the token read again at every request, as projected tokens
rotate), and HTTP as API servers speak it, against a raw TCP server here: chunked watches whose
events straddle chunks, bodies sized by Content-Length, refusals and a server that is gone."""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import ssl
import subprocess
from pathlib import Path

import pytest

from deviceplugin.model.errors import ConfigError
from deviceplugin.runtime.apiclient import (
    ApiClient,
    ApiError,
    Credentials,
    from_kubeconfig,
    in_cluster,
)


class RawServer:
    """Answers each connection with the next canned response; keeps every request head."""

    def __init__(self, *responses: list[bytes]) -> None:
        self.responses = list(responses)
        self.heads: list[str] = []
        self.server: asyncio.Server | None = None
        self.tls: ssl.SSLContext | None = None

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.tls)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        self.heads.append(head.decode())
        for part in self.responses.pop(0):
            writer.write(part)
            await writer.drain()
            await asyncio.sleep(0.01)
        writer.close()


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def test_a_watch_reads_events_that_straddle_chunks() -> None:
    first = json.dumps({"type": "ADDED", "object": {"metadata": {"name": "n"}}}).encode()
    second = json.dumps({"type": "MODIFIED", "object": {"metadata": {"name": "n"}}}).encode()
    stream = first + b"\n" + second + b"\n"
    response = [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n",
        chunk(stream[:7]),
        chunk(stream[7 : len(first) + 10]),
        chunk(stream[len(first) + 10 :]),
        b"0\r\n\r\n",
    ]

    async def body() -> list[str]:
        async with RawServer(response) as url:
            client = ApiClient(Credentials(server=url, token="t"))
            return [event["type"] async for event in client.watch("/api/v1/nodes?watch=1")]

    assert asyncio.run(body()) == ["ADDED", "MODIFIED"]


def test_the_token_file_is_read_at_every_request(tmp_path: Path) -> None:
    token = tmp_path / "token"
    ok = [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"]
    server = RawServer(ok, ok)

    async def body() -> None:
        async with server as url:
            client = ApiClient(Credentials(server=url, token_file=str(token)))
            token.write_text("first\n")
            await client.request("GET", "/api/v1/nodes/n")
            token.write_text("rotated\n")
            await client.request("GET", "/api/v1/nodes/n")

    asyncio.run(body())
    assert "Authorization: Bearer first\r\n" in server.heads[0]
    assert "Authorization: Bearer rotated\r\n" in server.heads[1]


def test_a_refusal_carries_the_status_and_the_servers_message() -> None:
    status = json.dumps({"kind": "Status", "message": 'nodes "n" is forbidden'}).encode()
    refused = [b"HTTP/1.1 403 Forbidden\r\nContent-Length: %d\r\n\r\n" % len(status) + status]

    async def body() -> ApiError:
        async with RawServer(refused) as url:
            with pytest.raises(ApiError) as caught:
                await ApiClient(Credentials(server=url)).request("PATCH", "/api/v1/nodes/n", {})
            return caught.value

    error = asyncio.run(body())
    assert error.status == 403 and 'nodes "n" is forbidden' in str(error)


def test_no_server_is_an_api_error_with_no_status() -> None:
    async def body() -> ApiError:
        async with RawServer() as url:
            pass  # closed again: nobody listens on that port now
        with pytest.raises(ApiError) as caught:
            await ApiClient(Credentials(server=url)).request("GET", "/api/v1/nodes")
        return caught.value

    error = asyncio.run(body())
    assert error.status == 0 and "unreachable" in str(error)


def test_a_kubeconfig_gives_server_ca_token_and_client_certificate(tmp_path: Path) -> None:
    (tmp_path / "ca.crt").write_bytes(b"CA")
    config = {
        "current-context": "c",
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        "clusters": [
            {
                "name": "k",
                "cluster": {"server": "https://10.0.0.1:6443/", "certificate-authority": "ca.crt"},
            }
        ],
        "users": [
            {
                "name": "u",
                "user": {
                    "token": "tok",
                    "client-certificate-data": base64.b64encode(b"CERT").decode(),
                    "client-key-data": base64.b64encode(b"KEY").decode(),
                },
            }
        ],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(config))
    creds = from_kubeconfig(str(path))
    assert (creds.server, creds.ca_data, creds.token) == ("https://10.0.0.1:6443", b"CA", "tok")
    assert (creds.cert_data, creds.key_data) == (b"CERT", b"KEY")


@pytest.mark.parametrize(
    ("document", "fragment"),
    [
        ("[]", "is not a kubeconfig"),
        ('{"current-context": "x"}', "no context named 'x'"),
        (
            '{"current-context": "c", "contexts": [{"name": "c", "context": {"cluster": "k",'
            ' "user": "u"}}], "clusters": [{"name": "k", "cluster": {"server": "https://s"}}],'
            ' "users": [{"name": "u", "user": {"exec": {}}}]}',
            "exec and auth-provider users are not supported",
        ),
    ],
)
def test_a_kubeconfig_that_cannot_work_is_refused_naming_why(
    tmp_path: Path, document: str, fragment: str
) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(document)
    with pytest.raises(ConfigError, match=fragment):
        from_kubeconfig(str(path))


def test_in_cluster_needs_the_service_and_a_token(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not in a pod with a service account token"):
        in_cluster({}, tmp_path)
    (tmp_path / "token").write_text("t")
    creds = in_cluster({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, tmp_path)
    assert creds.server == "https://10.0.0.1:443"
    assert creds.token_file == str(tmp_path / "token")
    assert creds.ca_file == str(tmp_path / "ca.crt")


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 that is its own CA, and its key."""
    cert, key = directory / "server.crt", directory / "server.key"
    request = [
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=apiserver",
    ]
    san = ["-addext", "subjectAltName=IP:127.0.0.1"]
    files = ["-keyout", str(key), "-out", str(cert)]
    subprocess.run(["openssl", *request, *san, *files], check=True, capture_output=True)
    return cert, key


@pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl to make certificates")
def test_https_is_verified_against_the_clusters_ca(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    served.load_cert_chain(cert, key)
    ok = [b'HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n{"kind":1}\n']

    async def body() -> tuple[dict[str, object], ApiError]:
        server = RawServer(ok, ok)
        server.tls = served
        async with server as url:
            https = url.replace("http://", "https://")
            trusted = ApiClient(Credentials(server=https, ca_data=cert.read_bytes()))
            answer = await trusted.request("GET", "/version")
            stranger = ApiClient(Credentials(server=https))  # the system's CAs only
            with pytest.raises(ApiError) as caught:
                await stranger.request("GET", "/version")
        return answer, caught.value

    answer, refused = asyncio.run(body())
    assert answer == {"kind": 1}
    assert refused.status == 0 and "CERTIFICATE_VERIFY_FAILED" in str(refused)
