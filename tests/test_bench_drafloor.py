"""The floor under `dra serve`'s start (bench/drafloor.py) does what bench/drastart.py counts on:
it imports nothing of ours, its socket answers as a DRA driver's registration socket, the
instant API server (bench/instantapi.py) holds the node's whole slice once it has posted, it
stops on SIGTERM, and a refused POST ends it, which the bench reports instead of waiting. The
instant server answers `dra serve`'s own start too: its list, its watch and its create."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from test_node_config import in_loop

from bench import process
from bench.drastart import node_slice, plugin_info, until_published
from bench.instantapi import InstantApi
from deviceplugin.wire.pluginregistration.v1 import api_pb2, api_pb2_grpc
from testbed.process import REPO, Child


async def _published(server: InstantApi, expected: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while server.devices < expected:
        assert time.monotonic() < deadline, "never published"
        await asyncio.sleep(0.01)


def test_the_floor_imports_nothing_of_ours(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "bench.drafloor", "-h"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    imported = [line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()]
    assert "grpc" in imported
    ours = [m for m in imported if m.startswith(("deviceplugin", "google.protobuf", "testbed"))]
    assert ours == []


@in_loop
async def test_the_floor_serves_registration_and_posts_the_node_slice(tmp_path: Path) -> None:
    body, expected = node_slice(tmp_path / "slice.json")
    assert expected == 32  # the preset: 4 whole GPUs and 28 MIG devices
    server = InstantApi()
    await server.start()
    socket = tmp_path / "reg.sock"
    info = plugin_info(tmp_path / "info.bin", socket)
    child = process.dra_floor(tmp_path, socket, server.url, body, info)
    try:
        child.start()
        await _published(server, expected)
        assert server.posts == ["/apis/resource.k8s.io/v1/resourceslices"]
        async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
            stub = api_pb2_grpc.RegistrationStub(channel)
            got = await stub.GetInfo(api_pb2.InfoRequest(), timeout=5)
            await stub.NotifyRegistrationStatus(
                api_pb2.RegistrationStatus(plugin_registered=True), timeout=5
            )
        assert (got.type, got.name, got.endpoint) == ("DRAPlugin", "gpu.nvidia.com", str(socket))
        assert got.supported_versions[0] == "v1.DRAPlugin"
        assert child.alive()
    finally:
        code = await asyncio.to_thread(child.stop)
        await server.stop()
    assert code == 0, child.tail()


@in_loop
async def test_a_refused_post_ends_the_floor_and_the_bench_says_so(tmp_path: Path) -> None:
    body = tmp_path / "slice.json"
    body.write_text("not json")  # the one thing the instant server refuses
    info = plugin_info(tmp_path / "info.bin", tmp_path / "reg.sock")

    def make(server: InstantApi) -> Child:
        return process.dra_floor(tmp_path, tmp_path / "reg.sock", server.url, body, info)

    with pytest.raises(RuntimeError, match="published no slices") as raised:
        await until_published(make, 1)
    assert "answered 400" in str(raised.value)
