"""An API server that answers at once: the far end of both `dra serve` and its floor
(bench/drafloor.py) in the start-up figure, so that neither time holds a cost of the server's.

The API-server stand-in (`sim/apiserver.py`) checks every slice against the OpenAPI schema and
the slice rules as it arrives, as a real API server does, but in Python: a cost both sides of
a ratio pay compresses the ratio. This one checks nothing. It speaks HTTP/1.1 on 127.0.0.1,
keep-alive, in the benchmark's own loop: a POST is answered 201 with the object it carried,
named (`generateName`) and given a uid and a resourceVersion (400 if it is not JSON); a GET
with `watch` in its query gets a chunked stream that stays open and empty until the client
leaves; any other GET an empty list; anything else 200 with the object it carried (or `{}`).
The devices of every ResourceSlice POSTed are counted in `devices`, which is what the
start-up benchmark waits for; `published` counts the devices of each slice as last written
(POST or PUT), for a benchmark that waits for a republish.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.parse
from typing import Any

_LIST = {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": "1"}, "items": []}


class InstantApi:
    """`await start()`, `url`, `devices`, `posts`, `await stop()`."""

    def __init__(self) -> None:
        self.devices = 0  # in every ResourceSlice POSTed so far
        self.posts: list[str] = []  # the path of every POST, in order
        self._slices: dict[str, int] = {}  # devices of each ResourceSlice as last written
        self._version = 1
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self.url = ""

    @property
    def published(self) -> int:
        """The devices of every ResourceSlice as last written."""
        return sum(self._slices.values())

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            while await self._answer(reader, writer):
                pass
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Read one request and answer it; False once the connection is to end."""
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers = {
            k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])
        }
        length = int(headers.get("content-length") or 0)
        body = await reader.readexactly(length) if length else b""
        path, _, query = target.partition("?")
        if method == "GET" and "watch" in urllib.parse.parse_qs(query):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
            writer.write(b"Transfer-Encoding: chunked\r\n\r\n")
            await writer.drain()
            await reader.read()  # open, with no event, until the client leaves
            return False
        if method == "GET":
            status, answer = "200 OK", _LIST
        elif method == "POST":
            try:
                status, answer = "201 Created", self._created(path, json.loads(body))
            except ValueError:
                status, answer = "400 Bad Request", {"kind": "Status", "message": "not JSON"}
        else:
            status, answer = "200 OK", json.loads(body) if body else {}
            self._count(answer)
        data = json.dumps(answer).encode()
        writer.write(
            f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n".encode()
            + data
        )
        await writer.drain()
        return True

    def _created(self, path: str, item: dict[str, Any]) -> dict[str, Any]:
        self.posts.append(path)
        self._version += 1
        metadata = item.setdefault("metadata", {})
        if "name" not in metadata:
            metadata["name"] = f"{metadata.get('generateName', 'object-')}{self._version}"
        metadata.update(uid=f"uid-{self._version}", resourceVersion=str(self._version))
        if item.get("kind") == "ResourceSlice":
            self.devices += len(item.get("spec", {}).get("devices") or [])
        self._count(item)
        return item

    def _count(self, item: dict[str, Any]) -> None:
        if item.get("kind") == "ResourceSlice":
            devices = item.get("spec", {}).get("devices") or []
            self._slices[item["metadata"]["name"]] = len(devices)
