"""The floor under `dra serve`'s start: the least a Python DRA driver does before its slices are
at the API server, as a process of its own (what `bench/echo.py` is for `serve`).

It imports grpc and the standard library, nothing of ours: no generated stubs, no protobuf.
It serves the kubelet's Registration service from a grpc.aio server on a unix socket, its
GetInfo answering the bytes of a DRA driver's PluginInfo read from a file (the benchmark
writes them with the driver's own stubs), then POSTs one ResourceSlice, read from a file as
JSON bytes, to the API server at URL. That slice is the one `dra serve` publishes for the same
node, and the server is the benchmark's instant one (`bench/instantapi.py`), which answers at
once for both. The POST uses the standard library's `http.client`, the cheapest HTTP client a
Python process can import, so that the floor holds no Kubernetes client and the ratio charges
ours (lightkube, httpx) to `dra serve`. A POST that is not answered 201 ends the process with
status 1. Serves until SIGTERM or SIGINT.

    python -m bench.drafloor SOCKET URL SLICE_JSON PLUGIN_INFO
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import signal
import sys
import urllib.parse
from pathlib import Path

import grpc

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
SERVICE = "pluginregistration.Registration"
TIMEOUT = 10.0


def registration(info: bytes) -> grpc.GenericRpcHandler[bytes, bytes]:
    """What the kubelet's plugin watcher asks a DRA driver's registration socket, answered with
    serialized messages: `info` for GetInfo, the empty RegistrationStatusResponse for the other.
    """

    async def get_info(request: bytes, context: object) -> bytes:
        return info

    async def notify(request: bytes, context: object) -> bytes:
        return b""

    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "GetInfo": grpc.unary_unary_rpc_method_handler(get_info),
            "NotifyRegistrationStatus": grpc.unary_unary_rpc_method_handler(notify),
        },
    )


def post(url: str, body: bytes) -> None:
    """One POST of `body` to the ResourceSlice collection; raises unless it was created."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=TIMEOUT)
    try:
        connection.request("POST", SLICES, body, {"Content-Type": "application/json"})
        answer = connection.getresponse()
        text = answer.read()
    finally:
        connection.close()
    if answer.status != 201:
        raise RuntimeError(f"POST {SLICES} answered {answer.status}: {text[:500]!r}")


async def main(socket: Path, url: str, body: bytes, info: bytes) -> None:
    """Serve, publish, then serve until SIGTERM or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((registration(info),))
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    post(url, body)
    await stop.wait()
    await server.stop(1.0)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.drafloor")
    parser.add_argument("socket", type=Path)
    parser.add_argument("url")
    parser.add_argument("slice", type=Path)
    parser.add_argument("info", type=Path)
    args = parser.parse_args()
    try:
        asyncio.run(main(args.socket, args.url, args.slice.read_bytes(), args.info.read_bytes()))
    except RuntimeError as err:
        sys.exit(f"drafloor: {err}")
