"""Allocate over the real gRPC socket: every pinned case of test_allocation, answered by a real
PluginServer on a unix socket with a fake driver root laid out in a temp dir."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import grpc
import pytest
from test_allocation import CASES, REJECTED, Case, Rejected, lay_out_host

from deviceplugin.kubelet.responder import NodeAllocator, to_proto
from deviceplugin.kubelet.server import PluginServer
from deviceplugin.model.config import Config
from deviceplugin.model.resources import ResourceSet
from deviceplugin.wire.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc


async def _allocate_over_socket(
    resource: ResourceSet, config: Config, root: Path, requests: Sequence[Sequence[str]]
) -> api_pb2.AllocateResponse:
    kubelet_dir = Path(tempfile.mkdtemp(prefix="dpa"))
    allocator = NodeAllocator(config, host=lay_out_host(root))
    server = PluginServer(resource, kubelet_dir, allocator)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"unix://{server.socket_path}") as channel:
            stub = api_pb2_grpc.DevicePluginStub(channel)
            request = api_pb2.AllocateRequest(
                container_requests=[
                    api_pb2.ContainerAllocateRequest(devices_ids=list(ids)) for ids in requests
                ]
            )
            response: api_pb2.AllocateResponse = await stub.Allocate(request)
            return response
    finally:
        await server.stop(0)
        shutil.rmtree(kubelet_dir, ignore_errors=True)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
def test_pinned_response_over_grpc(case: Case, tmp_path: Path) -> None:
    response = asyncio.run(
        _allocate_over_socket(case.resource, case.config(tmp_path), tmp_path, [case.request])
    )
    assert len(response.container_responses) == 1
    assert response.container_responses[0] == to_proto(case.expected_for(tmp_path))


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in REJECTED])
def test_rejected_over_grpc(case: Rejected, tmp_path: Path) -> None:
    config = Config()
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        asyncio.run(_allocate_over_socket(case.resource, config, tmp_path, [case.request]))
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details() == case.message


def test_each_container_gets_only_its_own_devices(tmp_path: Path) -> None:
    first, second = CASES[0], CASES[1]
    assert first.resource == second.resource
    response = asyncio.run(
        _allocate_over_socket(
            first.resource,
            first.config(tmp_path),
            tmp_path,
            [first.request[:1], first.request[1:]],
        )
    )
    shown = [dict(r.envs)["NVIDIA_VISIBLE_DEVICES"] for r in response.container_responses]
    assert shown == [first.request[0], first.request[1]]
