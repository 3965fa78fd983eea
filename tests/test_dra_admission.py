"""Admission at Prepare: allocations the scheduler would never make, written into a claim's
status directly (the stand-in serves whatever status a test writes) and sent through the
kubelet's DRA gRPC on the real socket, are refused before anything is written, each with a
reason naming the claim, the result's field and the device; what the scheduler does make is
still prepared. Memory shares on the simulated node, dynamic MIG on the simulated library."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
from test_dra_dynamic_mig_prepare import ONE_G_AT_0, THREE_G_AT_0, THREE_G_AT_4, read_back
from test_dra_dynamic_mig_prepare import PRESET as DYNAMIC
from test_dra_dynamic_mig_prepare import driver_root as library_root

from deviceplugin.dra.checkpoint import checksum
from deviceplugin.model.slices import device_name
from tests.draplugin import (
    DRIVER,
    Node,
    claim,
    run,
    running_driver,
    short_dir,
    with_admin_access,
)
from tests.simnode import gpu as simgpu
from tests.simnode import migs, write_node
from tests.test_dra_memory_shares import FOUND, WHOLE, WHOLE_GPU, shared

OTHER = device_name(next(g for g in FOUND.gpus if not g.mig_enabled and g != WHOLE_GPU), None)
SHARES = [f"7c9e6679-7425-40de-944b-e07fc1f90ae{n}" for n in range(5)]
GPU_MEMORY = WHOLE_GPU.memory_mib << 20
QUARTER = f"{WHOLE_GPU.memory_mib // 4}Mi"
WHOLE_SHARE = f"{WHOLE_GPU.memory_mib}Mi"
RESULT = "status.allocation.devices.results"


def failures(node: Node, reason: str) -> float:
    """How many claims Prepare refused for `reason`, as the driver's metrics say."""
    assert node.driver.preparer is not None
    node.driver.metrics.set_status(node.driver.status())
    for line in node.driver.metrics.render().decode().splitlines():
        if line.startswith(f'deviceplugin_dra_prepare_failures_total{{reason="{reason}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def saved_claims(node: Node) -> dict[str, Any]:
    path = node.kubelet_root / "plugins" / DRIVER / "checkpoint.json"
    if not path.exists():  # nothing was ever prepared
        return {}
    claims: dict[str, Any] = json.loads(path.read_text())["data"]["claims"]
    return claims


async def prepare_each(node: Node, bodies: Sequence[dict[str, Any]], batch: bool) -> list[str]:
    """Each claim's error ("" when prepared): all in one call, or one call each in order."""
    refs = [node.add_claim(body) for body in bodies]
    if batch:
        done = await node.watcher.prepare(DRIVER, refs)
        return [done.claims[ref[2]].error for ref in refs]
    errors = []
    for ref in refs:
        errors.append((await node.watcher.prepare(DRIVER, [ref])).claims[ref[2]].error)
    return errors


def test_four_quarter_shares_of_one_gpu_with_their_own_share_ids_are_prepared() -> None:
    async def body() -> None:
        async with running_driver(gpu_sharing="memory") as node:
            quarters = [shared(f"q{n}", (WHOLE, SHARES[n], QUARTER)) for n in range(4)]
            assert await prepare_each(node, quarters, batch=True) == ["", "", "", ""]
            one_more = shared("fifth", (WHOLE, SHARES[4], "1Gi"))
            (error,) = await prepare_each(node, [one_more], batch=False)
            assert "would bring its prepared shares to" in error, error
            assert len(saved_claims(node)) == 4

    run(body)


@pytest.mark.parametrize("memory", [f"{WHOLE_GPU.memory_mib + 1}Mi", str((1 << 63) - 1)])
def test_a_share_larger_than_its_gpu_is_refused(memory: str) -> None:
    async def body() -> None:
        async with running_driver(gpu_sharing="memory") as node:
            (error,) = await prepare_each(node, [shared("big", (WHOLE, SHARES[0], memory))], True)
            assert error.startswith(
                f"ResourceClaim default/big: {RESULT}[0].consumedCapacity.memory: a share of "
            ), error
            assert f"is more than the memory of {WHOLE} ({WHOLE_GPU.memory_mib} MiB)" in error
            assert failures(node, "overcommit") == 1
            assert not list(node.cdi_dir.glob("*.json")) and saved_claims(node) == {}

    run(body)


@pytest.mark.parametrize("batch", [False, True], ids=["prepared-before", "same-call"])
def test_two_whole_gpu_shares_of_one_gpu_are_refused(batch: bool) -> None:
    async def body() -> None:
        async with running_driver(gpu_sharing="memory") as node:
            first = shared("first", (WHOLE, SHARES[0], WHOLE_SHARE))
            second = shared("second", (WHOLE, SHARES[1], WHOLE_SHARE))
            ok, error = await prepare_each(node, [first, second], batch)
            assert ok == ""
            assert error == (
                f"ResourceClaim default/second: {RESULT}[0].consumedCapacity.memory: a share of"
                f" {WHOLE_GPU.memory_mib} MiB of {WHOLE} would bring its prepared shares to"
                f" {2 * WHOLE_GPU.memory_mib} MiB, more than its memory"
                f" ({WHOLE_GPU.memory_mib} MiB; held by ResourceClaim default/first)"
            )
            assert failures(node, "overcommit") == 1
            assert [c["name"] for c in saved_claims(node).values()] == ["first"]
            assert len(list(node.cdi_dir.glob("*.json"))) == 1

    run(body)


@pytest.mark.parametrize("one_claim", [False, True], ids=["two-claims", "one-claim"])
def test_one_share_id_on_two_gpus_is_refused(one_claim: bool) -> None:
    async def body() -> None:
        async with running_driver(gpu_sharing="memory") as node:
            if one_claim:
                both = shared("both", (WHOLE, SHARES[0], "1Gi"), (OTHER, SHARES[0], "1Gi"))
                (error,) = await prepare_each(node, [both], batch=True)
                holder = f"{RESULT}[0] of this claim"
                index = 1
            else:
                first = shared("first", (WHOLE, SHARES[0], "1Gi"))
                again = shared("again", (OTHER, SHARES[0], "1Gi"))
                ok, error = await prepare_each(node, [first, again], batch=False)
                assert ok == ""
                holder, index = "ResourceClaim default/first", 0
            assert f"{RESULT}[{index}].shareID: {SHARES[0]} is also the share ID of" in error
            assert error.endswith(
                f" {WHOLE} for {holder}; a share ID names one share of one device"
            )
            assert failures(node, "overlap") == 1

    run(body)


def test_two_shares_of_one_gpu_in_one_claim_are_refused() -> None:
    async def body() -> None:
        async with running_driver(gpu_sharing="memory") as node:
            pair = shared("pair", (WHOLE, SHARES[0], "1Gi"), (WHOLE, SHARES[1], "1Gi"))
            (error,) = await prepare_each(node, [pair], batch=True)
            assert error.startswith(
                f"ResourceClaim default/pair: {RESULT}[1]: {WHOLE} is also {RESULT}[0] of this"
                " claim; a claim holds a device, or a share of it, once"
            ), error
            assert failures(node, "overlap") == 1
            assert not list(node.cdi_dir.glob("*.json"))

    run(body)


# --- a GPU whole and as MIG devices -------------------------------------------------------------


@pytest.mark.parametrize("whole_first", [True, False], ids=["whole-first", "partition-first"])
def test_a_whole_gpu_and_a_partition_of_it_for_two_claims_are_refused(whole_first: bool) -> None:
    async def body() -> None:
        async with running_driver(DYNAMIC, library=True, mig_mode="dynamic") as node:
            whole = claim("whole", [("gpu", "gpu-0")])
            part = claim("part", [("mig", THREE_G_AT_4)])
            ok, error = await prepare_each(
                node, [whole, part] if whole_first else [part, whole], False
            )
            assert ok == ""
            late, held, holder = (
                ("part", THREE_G_AT_4, "gpu-0") if whole_first else ("whole", "gpu-0", THREE_G_AT_4)
            )
            assert error == (
                f"ResourceClaim default/{late}: {RESULT}[0]: {held} is of GPU gpu-0, which"
                f" ResourceClaim default/{'whole' if whole_first else 'part'} holds as {holder}:"
                " a GPU is handed out whole (or in shares) or as MIG devices, never both"
            )
            assert read_back(library_root(node))["gis"] == ([] if whole_first else [[9, 4, 4]])
            assert failures(node, "overlap") == 1
            # a monitor (admin access) may see the GPU whatever holds it
            monitor = with_admin_access(claim("monitor", [("gpu", "gpu-0")]))
            assert await prepare_each(node, [monitor], batch=True) == [""]

    run(body)


@pytest.mark.parametrize("batch", [False, True], ids=["prepared-before", "same-call"])
def test_overlapping_partitions_of_one_gpu_for_two_claims_are_refused(batch: bool) -> None:
    async def body() -> None:
        async with running_driver(DYNAMIC, library=True, mig_mode="dynamic") as node:
            first = claim("first", [("mig", THREE_G_AT_0)])
            inside = claim("inside", [("mig", ONE_G_AT_0)])
            beside = claim("beside", [("mig", THREE_G_AT_4)])
            errors = await prepare_each(node, [first, inside, beside], batch)
            assert errors[0] == errors[2] == ""
            assert errors[1] == (
                f"ResourceClaim default/inside: {RESULT}[0]: partition {ONE_G_AT_0} (placement"
                f" 0+1) overlaps {THREE_G_AT_0} (placement 0+4) of ResourceClaim default/first"
            )
            assert failures(node, "overlap") == 1
            assert read_back(library_root(node))["gis"] == [[9, 0, 4], [9, 4, 4]]

    run(body)


def test_a_static_mig_device_beside_its_whole_gpu_is_refused() -> None:
    """The GPU is prepared whole, then MIG is turned on and cut under the running driver: its
    MIG devices are published, and refused while the whole GPU is held."""
    node_file = write_node(short_dir("dranode") / "node.yaml", [simgpu(0), simgpu(1)])

    async def body() -> None:
        async with running_driver(simulate=str(node_file)) as node:
            (ok,) = await prepare_each(node, [claim("whole", [("gpu", "gpu-1")])], batch=True)
            assert ok == ""
            write_node(node_file, [simgpu(0), simgpu(1, **migs(1, "1g.10gb", "1g.10gb"))])
            assert await node.driver.rediscover() is True
            assert node.driver.preparer is not None
            mig = next(n for n in node.driver.preparer.devices.by_name if "gpu-1-mig" in n)
            (error,) = await prepare_each(node, [claim("mig", [("gpu", mig)])], batch=True)
            assert error == (
                f"ResourceClaim default/mig: {RESULT}[0]: {mig} is of GPU gpu-1, which"
                " ResourceClaim default/whole holds as gpu-1: a GPU is handed out whole (or in"
                " shares) or as MIG devices, never both"
            )

    run(body)


def test_a_whole_gpu_and_a_partition_of_it_in_one_claim_are_refused() -> None:
    async def body() -> None:
        async with running_driver(DYNAMIC, library=True, mig_mode="dynamic") as node:
            both = claim("both", [("gpu", "gpu-0"), ("mig", THREE_G_AT_4)])
            (error,) = await prepare_each(node, [both], batch=True)
            assert error == (
                f"ResourceClaim default/both: {RESULT}[1]: {THREE_G_AT_4} is of GPU gpu-0, which"
                f" {RESULT}[0] of this claim holds as gpu-0: a GPU is handed out whole (or in"
                " shares) or as MIG devices, never both"
            )
            assert read_back(library_root(node))["gis"] == []
            assert failures(node, "overlap") == 1

    run(body)


# --- what the allocation alone cannot grant ----------------------------------------------------


def test_admin_access_is_taken_only_where_the_claims_spec_asks_for_it() -> None:
    """A status written with `adminAccess` on a request whose spec does not ask for it (or on a
    `firstAvailable` subrequest, whose API has no such field) would skip every rule above: it
    is refused."""

    async def body() -> None:
        async with running_driver() as node:
            (ok,) = await prepare_each(node, [claim("owner", [("gpu", OTHER)])], batch=True)
            assert ok == ""
            forged = claim("forged", [("gpu", OTHER)])
            forged["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = True
            sub = claim("sub", [("gpu/big", OTHER)])
            sub["spec"]["devices"]["requests"] = [
                {
                    "name": "gpu",
                    "firstAvailable": [{"name": "big", "deviceClassName": DRIVER}],
                }
            ]
            sub["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = True
            monitor = with_admin_access(claim("monitor", [("gpu", OTHER)]))
            errors = await prepare_each(node, [forged, sub, monitor], batch=True)
            assert errors[0] == (
                f"ResourceClaim default/forged: {RESULT}[0].adminAccess: request 'gpu' of"
                " spec.devices.requests does not ask for admin access"
            )
            assert errors[1].startswith(f"ResourceClaim default/sub: {RESULT}[0].adminAccess:")
            assert errors[2] == ""
            assert failures(node, "invalid-config") == 2
            assert sorted(c["name"] for c in saved_claims(node).values()) == ["monitor", "owner"]

    run(body)


def test_a_share_id_on_a_gpu_not_published_shareable_is_refused() -> None:
    """Without memory shares a share ID limits nothing: two claims each with its own would hold
    one GPU uncapped."""

    async def body() -> None:
        async with running_driver() as node:
            first = shared("first", (WHOLE, SHARES[0], ""))
            second = shared("second", (WHOLE, SHARES[1], ""))
            errors = await prepare_each(node, [first, second], batch=True)
            for name, error in zip(("first", "second"), errors, strict=True):
                assert error == (
                    f"ResourceClaim default/{name}: {RESULT}[0].shareID: {WHOLE} is not"
                    " published shareable (this driver runs without --gpu-sharing memory)"
                )
            assert failures(node, "invalid-config") == 2
            assert saved_claims(node) == {} and not list(node.cdi_dir.glob("*.json"))

    run(body)


def test_a_share_of_a_gpu_published_beside_its_dynamic_partitions_is_refused() -> None:
    """With dynamic MIG a partitionable GPU is published whole and not shareable, even with
    memory shares on: the scheduler never makes a share of it, so Prepare refuses one."""

    async def body() -> None:
        async with running_driver(
            DYNAMIC, library=True, mig_mode="dynamic", gpu_sharing="memory"
        ) as node:
            (error,) = await prepare_each(node, [shared("s", ("gpu-0", SHARES[0], "1Gi"))], True)
            assert error == (
                f"ResourceClaim default/s: {RESULT}[0].shareID: gpu-0 is not published shareable"
                " (with --mig-mode dynamic a partitionable GPU is published whole beside its MIG"
                " partitions, never in shares)"
            )
            assert saved_claims(node) == {}

    run(body)


def test_a_share_checkpointed_without_its_size_counts_as_the_whole_gpu() -> None:
    """A share an earlier driver prepared without recording `memoryShare` holds all of its GPU
    until it is unprepared."""

    async def body() -> None:
        async with running_driver(gpu_sharing="memory") as node:
            (old,) = await prepare_each(node, [shared("old", (WHOLE, SHARES[0], QUARTER))], True)
            assert old == ""
            path = node.kubelet_root / "plugins" / DRIVER / "checkpoint.json"
            document = json.loads(path.read_text())
            for entry in document["data"]["claims"].values():
                for device in entry["devices"]:
                    del device["memoryShare"]
            document["checksum"] = checksum(document["data"])
            path.write_text(json.dumps(document))
            (error,) = await prepare_each(node, [shared("new", (WHOLE, SHARES[1], "1Gi"))], True)
            assert error == (
                f"ResourceClaim default/new: {RESULT}[0].consumedCapacity.memory: a share of"
                f" 1024 MiB of {WHOLE} would bring its prepared shares to"
                f" {WHOLE_GPU.memory_mib + 1024} MiB, more than its memory"
                f" ({WHOLE_GPU.memory_mib} MiB; held by ResourceClaim default/old, whose share's"
                " size was not recorded: counted as all of it)"
            )
            # saved again with another claim, the share stays unsized
            (ok,) = await prepare_each(node, [claim("elsewhere", [("gpu", OTHER)])], True)
            assert ok == ""
            old_entry = next(c for c in saved_claims(node).values() if c["name"] == "old")
            assert "memoryShare" not in old_entry["devices"][0]
            (again,) = await prepare_each(node, [shared("again", (WHOLE, SHARES[2], "1Gi"))], True)
            assert "whose share's size was not recorded" in again, again
            assert failures(node, "overcommit") == 2

    run(body)


# --- a claim shaped as no one would write -------------------------------------------------------


def test_a_malformed_claim_fails_alone_naming_its_field() -> None:
    """Claims whose status is not the shape Kubernetes serves (laid into the stand-in's store
    past its validation): each fails with the field named, the batch's good claim prepares."""

    def spoiled(status: Any) -> Any:
        return lambda body: body.update(status=status)

    def allocated(devices: Any) -> Any:
        return lambda body: body["status"]["allocation"].update(devices=devices)

    def result(value: Any) -> Any:
        return lambda body: body["status"]["allocation"]["devices"]["results"].append(value)

    spoils = {
        "devices": (allocated("x"), "status.allocation.devices: not an object (a str)"),
        "result": (result("x"), f"{RESULT}[1]: not an object (a str)"),
        "results": (allocated({"results": {"a": 1}}), f"{RESULT}: not a list"),
        "status": (spoiled(["x"]), "status: not an object (a list)"),
        "metadata": (lambda body: body.update(metadata="x"), "cannot be read: AttributeError"),
    }

    async def body() -> None:
        async with running_driver() as node:
            refs = [node.add_claim(claim(name, [("gpu", WHOLE)])) for name in [*spoils, "good"]]
            for name, (spoil, _) in spoils.items():
                spoil(node.server.claims[("default", name)])
            done = await node.watcher.prepare(DRIVER, refs)
            errors = [done.claims[uid].error for _, _, uid in refs]
            for error, (name, (_, why)) in zip(errors, spoils.items(), strict=False):
                assert error.startswith(f"ResourceClaim default/{name}"), error
                assert why in error, error
            assert errors[-1] == ""
            assert failures(node, "invalid-config") == len(spoils)
            assert [c["name"] for c in saved_claims(node).values()] == ["good"]

    run(body)
