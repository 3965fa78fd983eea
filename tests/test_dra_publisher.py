"""dra.publisher and dra.kubeapi against the API-server stand-in, over real HTTP with the real
async Kubernetes client: create, update with a generation bump, stale deletion, the per-slice
limit, retries after errors and conflicts, the unhealthy taint (its effect, and the time the
server stamped on it), a MIG re-cut, and the stand-in refusing what a server refuses."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from deviceplugin.dra.kubeapi import KubeApi, connect
from deviceplugin.dra.publisher import Backoff, SlicePublisher
from deviceplugin.model.errors import ConfigError
from deviceplugin.model.log import FIELDS
from deviceplugin.model.slices import build_devices, build_slices
from deviceplugin.runtime.kubeclient import KubeError
from deviceplugin.sim.apiserver import ApiServer
from tests.dranode import big_node, inventory
from tests.simnode import gpu as simgpu
from tests.simnode import migs, write_node

NODE = "node-1"
SAFETY = 10.0  # only a broken publisher waits this long; no test asserts on time


Scenario = Callable[..., Awaitable[None]]


def run(scenario: Scenario, *args: Any) -> None:
    """Run `scenario(server, publisher, *args)` against a fresh stand-in and publisher."""

    async def main() -> None:
        server = ApiServer()
        await server.start()
        try:
            api = connect(server=server.url)
            publisher = SlicePublisher(api, NODE, backoff=Backoff(first=0.01))
            try:
                await scenario(server, publisher, *args)
            finally:
                await publisher.close()
        finally:
            await server.stop()

    asyncio.run(main())


def writes(server: ApiServer) -> list[tuple[str, str]]:
    return [(m, p) for m, p in server.requests if m != "GET"]


def stored_devices(server: ApiServer) -> dict[str, dict[str, Any]]:
    return {
        d["name"]: d
        for s in server.slices.values()
        if s["spec"]["nodeName"] == NODE
        for d in s["spec"]["devices"]
    }


async def _first_publish_creates_the_pool_and_an_unchanged_one_writes_nothing(
    server: ApiServer, publisher: SlicePublisher
) -> None:
    found = inventory("a100-80gb-x8-mixed")
    assert await publisher.publish(found, {})
    (only,) = server.slices.values()
    assert only["metadata"]["name"] == f"{NODE}-gpu.nvidia.com-0"
    assert only["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
    assert len(only["spec"]["devices"]) == 32
    assert server.rejected == []
    before = len(server.requests)
    assert await publisher.publish(found, {})
    assert server.requests[before:] == []


def test_first_publish_creates_the_pool_and_an_unchanged_one_writes_nothing() -> None:
    run(_first_publish_creates_the_pool_and_an_unchanged_one_writes_nothing)


async def _a_health_change_rewrites_with_the_next_generation(
    server: ApiServer, publisher: SlicePublisher
) -> None:
    found = inventory("a100-80gb-x8-mixed")
    await publisher.publish(found, {})
    mig = found.gpus[2].mig_devices[0]
    assert await publisher.publish(found, {mig.uuid: "xid-94"})
    (only,) = server.slices.values()
    assert only["spec"]["pool"]["generation"] == 2
    sick = [d for d in only["spec"]["devices"] if not d["attributes"]["nvidia.com/healthy"]["bool"]]
    assert [d["attributes"]["uuid"]["string"] for d in sick] == [mig.uuid]
    assert sick[0]["taints"][0]["value"] == "xid-94"
    assert await publisher.publish(found, {})  # recovery
    assert all(
        d["attributes"]["nvidia.com/healthy"]["bool"] for d in stored_devices(server).values()
    )
    assert publisher.generation == 3


def test_a_health_change_rewrites_with_the_next_generation() -> None:
    run(_a_health_change_rewrites_with_the_next_generation)


async def _stale_slices_of_this_node_are_deleted_and_others_kept(
    server: ApiServer, publisher: SlicePublisher
) -> None:
    found = inventory("h100-x8")
    devices = build_devices(found)
    mine = build_slices(NODE, devices, 5)[0]
    mine["metadata"]["name"] = "left-over"
    other = build_slices("node-2", devices, 1)[0]
    api = connect(server=server.url)
    try:
        await api.create_slice(mine)
        await api.create_slice(other)
    finally:
        await api.close()
    assert await publisher.publish(found, {})
    assert sorted(server.slices) == [f"{NODE}-gpu.nvidia.com-0", "node-2-gpu.nvidia.com-0"]
    assert server.slices[f"{NODE}-gpu.nvidia.com-0"]["spec"]["pool"]["generation"] == 6
    assert ("DELETE", "/apis/resource.k8s.io/v1/resourceslices/left-over") in server.requests


def test_stale_slices_of_this_node_are_deleted_and_others_kept() -> None:
    run(_stale_slices_of_this_node_are_deleted_and_others_kept)


async def _another_pools_slice_on_this_node_is_left_alone(
    server: ApiServer, publisher: SlicePublisher
) -> None:
    """A slice on this node naming another pool is not the publisher's: it neither deletes it
    (the node-restriction policy would refuse, and the pool would never be published) nor lets
    its generation raise its own, and a change to it is no reason to repair."""
    found = inventory("h100-x8")
    stray = build_slices("node-2", build_devices(found), 9)[0]
    stray["metadata"]["name"] = "stray"
    stray["spec"]["nodeName"] = NODE
    api = connect(server=server.url)
    try:
        await api.create_slice(stray)
        assert await publisher.publish(found, {})
        assert sorted(server.slices) == [f"{NODE}-gpu.nvidia.com-0", "stray"]
        assert server.slices[f"{NODE}-gpu.nvidia.com-0"]["spec"]["pool"]["generation"] == 1
        assert ("DELETE", "/apis/resource.k8s.io/v1/resourceslices/stray") not in server.requests
        stray = server.slices["stray"]
        before = len(server.requests)
        publisher.check(list(server.slices.values()))
        publisher.changed_on_server("MODIFIED", stray)
        await api.delete_slice("stray")
        publisher.changed_on_server("DELETED", stray)
        assert await publisher.publish(found, {})  # a repair would list the slices again
        assert server.requests[before:] == [
            ("DELETE", "/apis/resource.k8s.io/v1/resourceslices/stray")
        ]
    finally:
        await api.close()


def test_another_pools_slice_on_this_node_is_left_alone() -> None:
    run(_another_pools_slice_on_this_node_is_left_alone)


async def _a_64_gpu_node_is_split_and_shrinking_deletes_the_extra_slices(
    server: ApiServer, publisher: SlicePublisher, tmp_path: Path
) -> None:
    big = inventory(str(big_node(tmp_path / "big.yaml")))
    assert await publisher.publish(big, {})
    assert server.rejected == []
    pools = [s["spec"]["pool"] for s in server.slices.values()]
    assert pools == [{"name": NODE, "generation": 1, "resourceSliceCount": 4}] * 4
    assert len(stored_devices(server)) == 448
    small = inventory(str(big_node(tmp_path / "small.yaml", gpus=10)))
    assert await publisher.publish(small, {})
    pools = [s["spec"]["pool"] for s in server.slices.values()]
    assert pools == [{"name": NODE, "generation": 2, "resourceSliceCount": 1}]
    assert len(stored_devices(server)) == 70


def test_a_64_gpu_node_is_split_and_shrinking_deletes_the_extra_slices(tmp_path: Path) -> None:
    run(_a_64_gpu_node_is_split_and_shrinking_deletes_the_extra_slices, tmp_path)


async def _an_api_error_is_retried_with_backoff_until_published(
    server: ApiServer, publisher: SlicePublisher
) -> None:
    found = inventory("a100-80gb-x8-mixed")
    server.fail_next(500, 3)
    assert not await publisher.publish(found, {})
    await asyncio.wait_for(publisher.wait_published(), SAFETY)
    assert len(stored_devices(server)) == 32
    assert server.requests[:3] == [("GET", "/apis/resource.k8s.io/v1/resourceslices")] * 3


def test_an_api_error_is_retried_with_backoff_until_published() -> None:
    run(_an_api_error_is_retried_with_backoff_until_published)


async def _a_newer_state_wins_over_a_pending_retry(
    server: ApiServer, publisher: SlicePublisher
) -> None:
    found = inventory("a100-80gb-x8-mixed")
    server.fail_next(503, 1)
    assert not await publisher.publish(found, {})
    sick = {found.gpus[0].uuid: "xid-79"}
    assert await publisher.publish(found, sick)
    await asyncio.wait_for(publisher.wait_published(), SAFETY)
    healthy = [
        d["attributes"]["nvidia.com/healthy"]["bool"] for d in stored_devices(server).values()
    ]
    assert healthy.count(False) == 7


def test_a_newer_state_wins_over_a_pending_retry() -> None:
    run(_a_newer_state_wins_over_a_pending_retry)


async def _a_conflict_re_lists_and_writes_again(
    server: ApiServer, publisher: SlicePublisher
) -> None:
    found = inventory("a100-80gb-x8-mixed")
    await publisher.publish(found, {})
    (name,) = server.slices
    server.slices[name]["metadata"]["resourceVersion"] = "999999"  # someone else wrote it
    sick = {found.gpus[3].uuid: "xid-48"}
    assert not await publisher.publish(found, sick)
    await asyncio.wait_for(publisher.wait_published(), SAFETY)
    assert server.slices[name]["spec"]["pool"]["generation"] == 2  # the refused write never counted
    healthy = [
        d["attributes"]["nvidia.com/healthy"]["bool"] for d in stored_devices(server).values()
    ]
    assert healthy.count(False) == 7


def test_a_conflict_re_lists_and_writes_again() -> None:
    run(_a_conflict_re_lists_and_writes_again)


async def _a_restarted_publisher_adopts_slices_that_already_say_the_same(
    server: ApiServer, publisher: SlicePublisher
) -> None:
    found = inventory("a100-80gb-x8-mixed")
    await publisher.publish(found, {})
    again = SlicePublisher(connect(server=server.url), NODE)
    try:
        before = len(server.requests)
        assert await again.publish(found, {})
        assert writes(server)[-1][0] == "POST"  # still the first publisher's create
        assert len(server.requests) == before + 1  # one list
        assert again.generation == 1
    finally:
        await again.close()


def test_a_restarted_publisher_adopts_slices_that_already_say_the_same() -> None:
    run(_a_restarted_publisher_adopts_slices_that_already_say_the_same)


async def _the_stand_in_refuses_what_the_api_server_refuses(
    server: ApiServer, publisher: SlicePublisher
) -> None:
    found = inventory("h100-x8")
    good = build_slices(NODE, build_devices(found), 1)[0]
    too_many = json.loads(json.dumps(good))
    too_many["spec"]["devices"] = [
        {**good["spec"]["devices"][0], "name": f"gpu-{n}"} for n in range(129)
    ]
    bad_attribute = json.loads(json.dumps(good))
    bad_attribute["spec"]["devices"][0]["attributes"]["type"] = {"text": "gpu"}
    bad_version = json.loads(json.dumps(good))
    bad_version["spec"]["devices"][0]["attributes"]["driverVersion"] = {"version": "550.90.07"}
    no_node = json.loads(json.dumps(good))
    del no_node["spec"]["nodeName"]
    api = connect(server=server.url)
    try:
        for body in (too_many, bad_attribute, bad_version, no_node):
            with pytest.raises(KubeError) as refused:
                await api.create_slice(body)
            assert refused.value.status == 422
        assert server.slices == {}
        created = await api.create_slice(good)
        with pytest.raises(KubeError) as twice:
            await api.create_slice(good)
        assert twice.value.status == 409
    finally:
        await api.close()
    assert len(server.rejected) == 4
    assert "Additional properties are not allowed" in server.rejected[1]
    assert created["metadata"]["resourceVersion"]


def test_the_stand_in_refuses_what_the_api_server_refuses() -> None:
    run(_the_stand_in_refuses_what_the_api_server_refuses)


async def _claims_are_read_by_namespace_and_name(
    server: ApiServer, publisher: SlicePublisher
) -> None:
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "gpu-claim", "namespace": "team-a"},
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]
            }
        },
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "gpu",
                            "driver": "gpu.nvidia.com",
                            "pool": NODE,
                            "device": "gpu-0",
                        }
                    ]
                }
            }
        },
    }
    server.add_claim(claim)
    api: KubeApi = connect(server=server.url)
    try:
        read = await api.read_claim("team-a", "gpu-claim")
        with pytest.raises(KubeError) as missing:
            await api.read_claim("team-b", "gpu-claim")
    finally:
        await api.close()
    assert read["status"]["allocation"]["devices"]["results"][0]["device"] == "gpu-0"
    assert read["metadata"]["uid"]
    assert missing.value.status == 404
    with pytest.raises(ValueError):
        server.add_claim({**claim, "spec": {"devices": {"requests": [{"nam": "x"}]}}})


def test_claims_are_read_by_namespace_and_name() -> None:
    run(_claims_are_read_by_namespace_and_name)


def test_an_unreachable_server_never_escapes_publish() -> None:
    asyncio.run(_unreachable())


async def _unreachable() -> None:
    stand_in = ApiServer()
    await stand_in.start()
    url = stand_in.url
    await stand_in.stop()
    publisher = SlicePublisher(connect(server=url), NODE, backoff=Backoff(first=0.01))
    try:
        found = inventory("h100-x8")
        assert not await publisher.publish(found, {})
    finally:
        await publisher.close()


async def _kubeconfig(server: ApiServer, publisher: SlicePublisher, tmp_path: Path) -> None:
    found = inventory("h100-x8")
    await publisher.publish(found, {})
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "stand-in", "cluster": {"server": server.url}}],
        "users": [{"name": "driver", "user": {"token": "not-checked"}}],
        "contexts": [{"name": "here", "context": {"cluster": "stand-in", "user": "driver"}}],
        "current-context": "here",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(config))
    api = connect(kubeconfig=str(path))
    try:
        (listed,), _ = await api.list_slices(NODE, "gpu.nvidia.com")
        assert (await api.list_slices("node-9", "gpu.nvidia.com")).items == []
    finally:
        await api.close()
    assert listed["spec"]["pool"]["name"] == NODE


def test_a_kubeconfig_file_points_the_client_at_its_server(tmp_path: Path) -> None:
    run(_kubeconfig, tmp_path)


def test_without_kubeconfig_or_a_pod_environment_connect_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    with pytest.raises(ConfigError, match="kubeconfig"):
        connect()
    with pytest.raises(ConfigError, match="kubeconfig"):
        connect(kubeconfig="/nonexistent/kubeconfig")


async def _wiped(server: ApiServer, publisher: SlicePublisher) -> None:
    found = inventory("a100-80gb-x8-mixed")
    assert not await publisher.refresh()  # nothing to publish yet: no empty pool
    assert server.requests == []
    await publisher.publish(found, {})
    async with aiohttp.ClientSession() as session:  # the kubelet's wipe at its restart
        selector = f"spec.nodeName={NODE},spec.driver=gpu.nvidia.com"
        async with session.delete(
            f"{server.url}/apis/resource.k8s.io/v1/resourceslices",
            params={"fieldSelector": selector},
        ) as answer:
            assert answer.status == 200
    assert server.slices == {}
    assert await publisher.publish(found, {})
    assert server.slices == {}  # nothing changed as far as the publisher knows
    assert await publisher.refresh()
    (only,) = server.slices.values()
    assert only["spec"]["pool"]["generation"] == 2
    assert len(only["spec"]["devices"]) == 32


def test_refresh_repairs_slices_the_kubelet_wiped() -> None:
    run(_wiped)


async def _a_failed_repair_is_retried(server: ApiServer, publisher: SlicePublisher) -> None:
    await publisher.publish(inventory("a100-80gb-x8-mixed"), {})
    server.slices.clear()  # wiped behind the publisher's back
    server.fail_next(503)
    assert not await publisher.refresh()
    async with asyncio.timeout(SAFETY):
        while not server.slices:
            await asyncio.sleep(0.01)
    await asyncio.wait_for(publisher.wait_published(), SAFETY)


def test_a_failed_repair_is_retried_until_the_slices_are_back() -> None:
    run(_a_failed_repair_is_retried)


async def _a_taint_keeps_the_time_the_server_stamped(
    server: ApiServer, publisher: SlicePublisher
) -> None:
    """The API server stamps `timeAdded` on a taint written without one; a rewrite for some
    other device must carry it, or a NoExecute toleration's countdown would start over."""
    found = inventory("h100-x8")
    first = {found.gpus[1].uuid: "xid-79"}
    assert await publisher.publish(found, first)
    (name,) = server.slices
    stamped = "2026-01-02T03:04:05Z"
    server.slices[name]["spec"]["devices"][1]["taints"][0]["timeAdded"] = stamped
    before = len(writes(server))
    assert await publisher.refresh()  # re-lists: the same but for the stamp, so adopted
    assert len(writes(server)) == before
    assert await publisher.publish(found, {**first, found.gpus[5].uuid: "xid-48"})
    devices = stored_devices(server)
    assert devices["gpu-1"]["taints"][0]["timeAdded"] == stamped
    assert "timeAdded" not in devices["gpu-5"]["taints"][0]  # new: the server stamps it
    assert server.rejected == []
    assert await publisher.publish(found, {})  # recovered: the taint and its time are gone
    assert not any("taints" in d for d in stored_devices(server).values())


def test_a_taint_keeps_the_time_the_server_stamped() -> None:
    run(_a_taint_keeps_the_time_the_server_stamped)


@pytest.mark.parametrize("taint", ["NoExecute", None])
def test_the_taint_of_an_unhealthy_device_is_the_one_asked_for(taint: Any) -> None:
    async def scenario(server: ApiServer, _: SlicePublisher) -> None:
        found = inventory("a100-80gb-x8-mixed")
        publisher = SlicePublisher(connect(server=server.url), NODE, taint=taint)
        try:
            assert await publisher.publish(found, {found.gpus[0].uuid: "xid-79"})
        finally:
            await publisher.close()
        sick = [d for d in stored_devices(server).values() if d["name"].startswith("gpu-0-")]
        assert len(sick) == 7
        for device in sick:
            assert device["attributes"]["nvidia.com/healthy"] == {"bool": False}
            effects = [t["effect"] for t in device.get("taints", [])]
            assert effects == ([taint] if taint else [])

    run(scenario)


async def _enabling_mig_on_a_gpu_republishes_it_as_its_mig_devices(
    server: ApiServer, publisher: SlicePublisher, tmp_path: Path
) -> None:
    node = write_node(tmp_path / "node.yaml", [simgpu(0), simgpu(1)])
    assert await publisher.publish(inventory(str(node)), {})
    assert sorted(stored_devices(server)) == ["gpu-0", "gpu-1"]
    write_node(node, [simgpu(0), simgpu(1, **migs(1, "1g.10gb", "2g.20gb"))])
    assert await publisher.publish(inventory(str(node)), {})
    assert sorted(stored_devices(server)) == ["gpu-0", "gpu-1-mig-1-0", "gpu-1-mig-2-0"]
    profiles = {
        n: d["attributes"]["nvidia.com/migProfile"]["string"]
        for n, d in stored_devices(server).items()
    }
    assert profiles == {"gpu-0": "", "gpu-1-mig-1-0": "1g.10gb", "gpu-1-mig-2-0": "2g.20gb"}
    assert publisher.generation == 2


def test_enabling_mig_on_a_gpu_republishes_it_as_its_mig_devices(tmp_path: Path) -> None:
    run(_enabling_mig_on_a_gpu_republishes_it_as_its_mig_devices, tmp_path)


class Refusals:
    """A publish observer that counts what the API server refused."""

    def __init__(self) -> None:
        self.refused: list[str] = []

    def publish_done(self, seconds: float, ok: bool) -> None:
        pass

    def slices_repaired(self) -> None:
        pass

    def api_write_refused(self, resource: str) -> None:
        self.refused.append(resource)


def test_a_refused_write_is_logged_once_counted_each_time_and_shown_until_one_succeeds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="deviceplugin")
    policy = (
        "ValidatingAdmissionPolicy 'deviceplugin-dra-own-node' with binding"
        " 'deviceplugin-dra-own-node' denied request: a driver writes only its own node's slices"
    )
    found = inventory("a100-80gb-x8-mixed")

    async def main() -> None:
        server = ApiServer()
        await server.start()
        observer = Refusals()
        publisher = SlicePublisher(
            connect(server=server.url),
            NODE,
            backoff=Backoff(first=0.01, most=0.02),
            observer=observer,
        )
        try:
            server.refuse_writes(policy)
            assert not await publisher.publish(found, {})
            while len(observer.refused) < 3:  # retried all the same: the policy may be fixed
                await asyncio.sleep(0.01)
            assert set(observer.refused) == {"resourceslices"}
            assert publisher.refusal is not None and policy in publisher.refusal
            assert server.slices == {}

            server.refuse_writes(None)
            await asyncio.wait_for(publisher.wait_published(), SAFETY)
            assert publisher.refusal is None and len(server.slices) == 1
        finally:
            await publisher.close()
            await server.stop()

    asyncio.run(main())
    refused = [r for r in caplog.records if r.getMessage() == "api.write.refused"]
    assert len(refused) == 1 and refused[0].levelno == logging.ERROR
    assert policy in str(getattr(refused[0], FIELDS)["error"])
    assert not [r for r in caplog.records if r.getMessage() == "dra.publish.failed"]


def test_a_fresh_list_cuts_a_failed_writes_backoff_short() -> None:
    """The slice watch's list answered: the API server is back, so the publisher's retry does
    not wait out a backoff that grew while the server hung."""
    found = inventory("a100-80gb-x8-mixed")

    async def main() -> None:
        server = ApiServer()
        await server.start()
        publisher = SlicePublisher(connect(server=server.url), NODE, backoff=Backoff(first=30.0))
        try:
            server.fail_next(503)
            assert not await publisher.publish(found, {})
            lister = connect(server=server.url)
            publisher.check((await lister.list_slices(NODE, "gpu.nvidia.com")).items)
            await lister.close()
            await asyncio.wait_for(publisher.wait_published(), SAFETY)
        finally:
            await publisher.close()
            await server.stop()

    asyncio.run(main())
