"""The baseline: a bare grpc.aio DevicePlugin server that answers every call with a fixed message.

It runs as its own process, like the plugin, built from the same v1beta1 stubs, on a unix
socket, so a figure divided by the echo's shows what the plugin adds on top of gRPC and Python.
The answers are the plugin's own earlier answers (same sizes both ways), read from
`<answers>/<Method>.bin`. ListAndWatch sends a fixed list and sends it again on each
PreStartContainer call, so the benchmark can time a bare list push. With `--register RESOURCE`
it registers with the kubelet.sock next to its socket once listening: the least any Python
plugin pays from exec to registered.

    python -m bench.echo SOCKET [--answers DIR] [--register RESOURCE]
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.message import Message

from deviceplugin.wire.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc

OPTIONS = api_pb2.DevicePluginOptions(get_preferred_allocation_available=True)


def write_answers(directory: Path, **answers: Message) -> Path:
    """Store fixed answers by method name (Allocate=..., ListAndWatch=...) for the echo."""
    directory.mkdir(parents=True, exist_ok=True)
    for method, message in answers.items():
        (directory / f"{method}.bin").write_bytes(message.SerializeToString())
    return directory


class Echo(api_pb2_grpc.DevicePluginServicer):
    """Fixed answers, no work: the floor under every DevicePlugin call."""

    def __init__(self, answers: Path | None) -> None:
        def load(method: str) -> bytes:
            path = answers / f"{method}.bin" if answers else None
            return path.read_bytes() if path and path.exists() else b""

        self._allocate = api_pb2.AllocateResponse.FromString(load("Allocate"))
        self._preferred = api_pb2.PreferredAllocationResponse.FromString(
            load("GetPreferredAllocation")
        )
        self._list = api_pb2.ListAndWatchResponse.FromString(load("ListAndWatch"))
        self._pushes = 0
        self._closing = False
        self._changed = asyncio.Condition()

    async def close(self) -> None:
        """End open streams, as the plugin does when it stops."""
        self._closing = True
        async with self._changed:
            self._changed.notify_all()

    async def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.DevicePluginOptions:
        return OPTIONS

    async def ListAndWatch(
        self, request: api_pb2.Empty, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        sent = -1
        while not self._closing:
            if sent != self._pushes:
                sent = self._pushes
                yield self._list
                continue
            async with self._changed:
                await self._changed.wait_for(self._news(sent))

    def _news(self, sent: int) -> Callable[[], bool]:
        return lambda: self._closing or sent != self._pushes

    async def Allocate(
        self, request: api_pb2.AllocateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.AllocateResponse:
        return self._allocate

    async def GetPreferredAllocation(
        self,
        request: api_pb2.PreferredAllocationRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> api_pb2.PreferredAllocationResponse:
        return self._preferred

    async def PreStartContainer(
        self, request: api_pb2.PreStartContainerRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.PreStartContainerResponse:
        self._pushes += 1
        async with self._changed:
            self._changed.notify_all()
        return api_pb2.PreStartContainerResponse()


async def register(socket: Path, resource: str) -> None:
    """One Register call to the kubelet.sock next to `socket`."""
    request = api_pb2.RegisterRequest(
        version="v1beta1", endpoint=socket.name, resource_name=resource, options=OPTIONS
    )
    async with grpc.aio.insecure_channel(f"unix://{socket.parent / 'kubelet.sock'}") as channel:
        await api_pb2_grpc.RegistrationStub(channel).Register(request, timeout=5)


async def main(socket: Path, answers: Path | None, resource: str | None) -> None:
    """Serve until SIGTERM or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 16 * 1024 * 1024)])
    echo = Echo(answers)
    api_pb2_grpc.add_DevicePluginServicer_to_server(echo, server)
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    if resource:
        await register(socket, resource)
    await stop.wait()
    await echo.close()
    await server.stop(1.0)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.echo")
    parser.add_argument("socket", type=Path)
    parser.add_argument("--answers", type=Path)
    parser.add_argument("--register", metavar="RESOURCE")
    args = parser.parse_args()
    asyncio.run(main(args.socket, args.answers, args.register))
