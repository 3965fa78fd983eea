"""The floor under `dra serve`'s start: the least a Python DRA driver does before its slices are
at the API server, as a process of its own (what `bench/echo.py` is for `serve`).

It imports grpc and the kubelet's plugin-registration stubs, serves the Registration service
from a grpc.aio server on a unix socket (GetInfo answers as a DRA driver's does), then POSTs one
ResourceSlice, read from a file as JSON bytes, to the API server at URL. That slice is the one
`dra serve` publishes for the same node, so the stand-in validates the same devices for both,
and the benchmark sees both ready the same way: the stand-in holds every device. The POST uses
the standard library's `http.client`, the cheapest HTTP client a Python process can import, so
that the floor holds no Kubernetes client and the ratio charges ours (lightkube, httpx) to
`dra serve`. A POST that is not answered 201 ends the process with status 1. Serves until
SIGTERM or SIGINT.

    python -m bench.drafloor SOCKET URL SLICE_JSON
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import signal
import sys
import urllib.parse
from pathlib import Path
from typing import Any

import grpc

from deviceplugin.wire.pluginregistration.v1 import api_pb2, api_pb2_grpc

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
DRIVER = "gpu.nvidia.com"
TIMEOUT = 10.0


class Registration(api_pb2_grpc.RegistrationServicer):
    """What the kubelet's plugin watcher asks a DRA driver's registration socket."""

    def __init__(self, endpoint: Path) -> None:
        self._info = api_pb2.PluginInfo(
            type="DRAPlugin",
            name=DRIVER,
            endpoint=str(endpoint),
            supported_versions=["v1.DRAPlugin"],
        )

    async def GetInfo(
        self, request: api_pb2.InfoRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.PluginInfo:
        return self._info

    async def NotifyRegistrationStatus(
        self, request: api_pb2.RegistrationStatus, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.RegistrationStatusResponse:
        return api_pb2.RegistrationStatusResponse()


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


async def main(socket: Path, url: str, body: bytes) -> None:
    """Serve, publish, then serve until SIGTERM or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = grpc.aio.server()
    api_pb2_grpc.add_RegistrationServicer_to_server(Registration(socket), server)
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
    args = parser.parse_args()
    try:
        asyncio.run(main(args.socket, args.url, args.slice.read_bytes()))
    except RuntimeError as err:
        sys.exit(f"drafloor: {err}")
