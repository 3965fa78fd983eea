"""The floor under `dra serve`'s start (bench/drafloor.py) does what bench/drastart.py counts on:
its socket answers as a DRA driver's registration socket, the stand-in holds the node's whole
slice once it has posted, it stops on SIGTERM, and a refused POST ends it, which the bench
reports instead of waiting."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import pytest
from test_node_config import in_loop

from bench import process
from bench.drastart import node_slice, published, until_published
from deviceplugin.sim.apiserver import ApiServer
from deviceplugin.wire.pluginregistration.v1 import api_pb2, api_pb2_grpc
from testbed.process import Child


async def _published(server: ApiServer, expected: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while published(server) < expected:
        assert time.monotonic() < deadline, "the floor never published"
        await asyncio.sleep(0.01)


@in_loop
async def test_the_floor_serves_registration_and_posts_the_node_slice(tmp_path: Path) -> None:
    body, expected = node_slice(tmp_path / "slice.json")
    assert expected == 32  # the preset: 4 whole GPUs and 28 MIG devices
    server = ApiServer()
    await server.start()
    socket = tmp_path / "reg.sock"
    child = process.dra_floor(tmp_path, socket, server.url, body)
    try:
        child.start()
        await _published(server, expected)
        assert server.rejected == []
        assert [method for method, _ in server.requests] == ["POST"]
        async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
            info = await api_pb2_grpc.RegistrationStub(channel).GetInfo(
                api_pb2.InfoRequest(), timeout=5
            )
        assert (info.type, info.name, list(info.supported_versions)) == (
            "DRAPlugin",
            "gpu.nvidia.com",
            ["v1.DRAPlugin"],
        )
        assert child.alive()
    finally:
        code = await asyncio.to_thread(child.stop)
        await server.stop()
    assert code == 0, child.tail()


@in_loop
async def test_a_refused_post_ends_the_floor_and_the_bench_says_so(tmp_path: Path) -> None:
    body = tmp_path / "slice.json"
    body.write_text('{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice"}')

    def make(server: ApiServer) -> Child:
        return process.dra_floor(tmp_path, tmp_path / "reg.sock", server.url, body)

    with pytest.raises(RuntimeError, match="published no slices") as raised:
        await until_published(make, 1)
    assert "answered 422" in str(raised.value)
