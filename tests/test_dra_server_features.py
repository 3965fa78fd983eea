"""The DRA driver against an API server whose feature gates drop ResourceSlice fields (the
stand-in emulating a release's default gates): the probe finds what the server keeps, dynamic
MIG and memory shares publish nothing the scheduler could overbook and name the gate they need,
an unhealthy device leaves the slice where taints are dropped, and a server upgrade is noticed.
Proved on the stand-in only; a real cluster of each release is separate work."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from deviceplugin.dra.kubeapi import KubeApi, connect
from deviceplugin.dra.serverfeatures import ServerProbe
from deviceplugin.model.gatedfields import (
    CONSUMABLE_CAPACITY,
    DEVICE_TAINTS,
    PARTITIONABLE_DEVICES,
    ServerFeatures,
)
from deviceplugin.model.log import FIELDS
from deviceplugin.model.slices import device_name
from deviceplugin.ops.http import DraEndpoints, EndpointServer
from deviceplugin.runtime.kubeclient import KubeError
from deviceplugin.sim.apiserver import ApiServer
from tests.dranode import inventory
from tests.draplugin import DRIVER, NODE, PRESET, Node, claim, published, run, running_driver
from tests.test_http import get

DYNAMIC = "a100-80gb-x8-dynamic"
FOUND = inventory(PRESET)
WHOLE = next(gpu for gpu in FOUND.gpus if not gpu.mig_enabled)
WHOLE_NAME = device_name(WHOLE, None)
FIRST_ON = "on by default from Kubernetes 1.36"


def gate_errors(caplog: pytest.LogCaptureFixture, gate: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.getMessage() == "dra.server.gate_off" and getattr(r, FIELDS)["gate"] == gate
    ]


async def readyz(node: Node) -> tuple[int, str]:
    http = EndpointServer("127.0.0.1:0", DraEndpoints(node.driver))
    await http.start()
    try:
        assert http.port is not None
        status, _, body = await get(http.port, "/readyz")
        return status, body.decode()
    finally:
        await http.stop()


def counter_slices(server: ApiServer) -> list[dict[str, object]]:
    return [s for s in server.slices.values() if s["spec"].get("sharedCounters")]


@pytest.mark.parametrize(
    ("gates_off", "expected"),
    [
        ((), ServerFeatures(True, True, True, "v1.37.2")),
        ({PARTITIONABLE_DEVICES}, ServerFeatures(False, True, True, "v1.37.2")),
        ({CONSUMABLE_CAPACITY}, ServerFeatures(True, False, True, "v1.37.2")),
        ({DEVICE_TAINTS}, ServerFeatures(True, True, False, "v1.37.2")),
    ],
    ids=["all-on", "counters-off", "capacity-off", "taints-off"],
)
def test_the_probe_finds_what_the_server_keeps_and_stores_nothing(
    gates_off: set[str], expected: ServerFeatures
) -> None:
    async def body() -> None:
        server = ApiServer(gates_off=gates_off)
        await server.start()
        api = connect(server=server.url)
        try:
            assert await ServerProbe(api, NODE, DRIVER).probe() == expected
            assert server.slices == {} and len(server.dry_runs) == 2
            assert server.rejected == []
        finally:
            await api.close()
            await server.stop()

    run(body)


class CountersInTheirOwnSliceRefused:
    """The stand-in's API, refusing a device that consumes counters of another slice (422), as
    a 1.34 server with DRAPartitionableDevices on is expected to."""

    def __init__(self, api: KubeApi) -> None:
        self.api = api

    async def server_version(self) -> str:
        return await self.api.server_version()

    async def dry_run_slice(self, body: dict[str, Any]) -> dict[str, Any]:
        if any(d.get("consumesCounters") for d in body["spec"].get("devices") or []):
            raise KubeError("dry-run create: 422 Invalid: counter set not in this slice", 422)
        return await self.api.dry_run_slice(body)


def test_a_server_that_wants_counters_beside_their_devices_counts_as_dropping_them() -> None:
    async def body() -> None:
        server = ApiServer()
        await server.start()
        api = connect(server=server.url)
        try:
            probe = ServerProbe(CountersInTheirOwnSliceRefused(api), NODE, DRIVER)
            assert await probe.probe() == ServerFeatures(False, True, True, "v1.37.2")
        finally:
            await api.close()
            await server.stop()

    run(body)


def test_a_probe_that_cannot_be_made_keeps_everything_unknown_and_never_raises() -> None:
    async def body() -> None:
        server = ApiServer()
        await server.start()
        api = connect(server=server.url)
        try:
            server.refuse_writes("dry run denied")
            found = await ServerProbe(api, NODE, DRIVER).probe()
            assert not (found.known or found.counters or found.consumable_capacity or found.taints)
            assert found.error is not None and "dry run denied" in found.error
        finally:
            await api.close()
            await server.stop()

    run(body)


def test_dynamic_mig_on_135_publishes_no_partition_and_names_the_gate(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="deviceplugin")

    async def body() -> None:
        async with running_driver(
            DYNAMIC, library=True, mig_mode="dynamic", kubernetes="1.35"
        ) as node:
            assert node.driver.inventory is not None
            devices = published(node.server)
            assert set(devices) == {f"gpu-{gpu.minor}" for gpu in node.driver.inventory.gpus}
            assert not any(d.get("consumesCounters") for d in devices.values())
            assert counter_slices(node.server) == []
            status = node.driver.status()
            assert status.server_features is not None
            assert status.server_features["counters"] is False
            assert status.server_features["version"] == "v1.35.4"
            reasons = [r for r in status.not_ready if PARTITIONABLE_DEVICES in r]
            assert len(reasons) == 1 and FIRST_ON in reasons[0]
            code, text = await readyz(node)
            assert code == 503 and PARTITIONABLE_DEVICES in text and FIRST_ON in text
            assert node.server.rejected == []

    run(body)
    errors = gate_errors(caplog, PARTITIONABLE_DEVICES)
    assert len(errors) == 1 and errors[0].levelno == logging.ERROR
    assert FIRST_ON in getattr(errors[0], FIELDS)["error"]


def test_memory_shares_on_135_publish_whole_gpus_without_shares_and_name_the_gate(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="deviceplugin")

    async def body() -> None:
        async with running_driver(gpu_sharing="memory", kubernetes="1.35") as node:
            devices = published(node.server)
            assert WHOLE_NAME in devices
            assert not any(d.get("allowMultipleAllocations") for d in devices.values())
            assert not any(
                "requestPolicy" in c for d in devices.values() for c in d["capacity"].values()
            )
            # not offered to the shared classes either, which would get a whole GPU as a share
            assert not any("nvidia.com/memoryShares" in d["attributes"] for d in devices.values())
            reasons = [r for r in node.driver.status().not_ready if CONSUMABLE_CAPACITY in r]
            assert len(reasons) == 1 and FIRST_ON in reasons[0]
            code, text = await readyz(node)
            assert code == 503 and CONSUMABLE_CAPACITY in text

    run(body)
    errors = gate_errors(caplog, CONSUMABLE_CAPACITY)
    assert len(errors) == 1 and errors[0].levelno == logging.ERROR


def test_where_taints_are_dropped_an_unhealthy_device_leaves_the_slice_and_comes_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="deviceplugin")

    async def body() -> None:
        async with running_driver(recovery="2s", kubernetes="1.35") as node:
            assert node.driver.status().not_ready == []  # nothing asked is missing
            ref = node.add_claim(claim("kept", [("gpu", WHOLE_NAME)]))
            assert (await node.watcher.prepare(DRIVER, [ref])).claims[ref[2]].error == ""
            others = set(published(node.server)) - {WHOLE_NAME}

            node.event(uuid=WHOLE.uuid, xid=79)
            await node.until(lambda: WHOLE_NAME not in published(node.server))
            assert set(published(node.server)) == others
            assert all(
                d["attributes"]["nvidia.com/healthy"]["bool"]
                for d in published(node.server).values()
            )
            assert node.driver.preparer is not None and ref[2] in node.driver.preparer.prepared

            await node.until(lambda: WHOLE_NAME in published(node.server))
            back = published(node.server)[WHOLE_NAME]
            assert back["attributes"]["nvidia.com/healthy"]["bool"] and "taints" not in back

    run(body)
    assert len(gate_errors(caplog, DEVICE_TAINTS)) == 1


def test_with_every_gate_on_the_probe_changes_nothing() -> None:
    async def body() -> None:
        async with running_driver(DYNAMIC, library=True, mig_mode="dynamic") as node:
            status = node.driver.status()
            assert status.server_features is not None
            assert status.server_features["known"] and status.server_features["counters"]
            assert status.not_ready == [] and status.features_missing == ()
            assert counter_slices(node.server) != []
            assert any(d.get("consumesCounters") for d in published(node.server).values())
            assert not any("probe" in name for name in node.server.slices)

    run(body)


def test_an_api_server_upgrade_is_probed_again_and_partitions_follow() -> None:
    async def body() -> None:
        async with running_driver(
            DYNAMIC, library=True, mig_mode="dynamic", kubernetes="1.35"
        ) as node:
            assert counter_slices(node.server) == []
            probes = len(node.server.dry_runs)
            assert not await node.driver.check_server()  # the same server: one GET, no probe
            assert len(node.server.dry_runs) == probes

            node.server.emulate("1.36")
            assert await node.driver.check_server()
            await node.synced()
            assert counter_slices(node.server) != []
            assert any(d.get("consumesCounters") for d in published(node.server).values())
            status = node.driver.status()
            assert status.not_ready == []
            assert status.server_features is not None
            assert status.server_features["version"] == "v1.36.3"

    run(body)
