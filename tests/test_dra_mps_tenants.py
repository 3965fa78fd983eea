"""The MPS tenant boundary of the DRA driver, over the real DRA socket on the simulated
libnvidia-ml.so.1 and the simulated `nvidia-cuda-mps-control`, with claims of several namespaces
taking memory shares of one GPU: a device's daemon serves one namespace's claims (or a group's,
with `--mps-shared-namespaces`), another namespace's claim is refused at Prepare naming the
namespace the daemon serves, a restarted driver keeps that rule, and once a namespace's claims
have all left, the next namespace's daemon starts in fresh directories."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import pytest

from deviceplugin.cli import parse_options
from deviceplugin.dra.mpstenants import shared_namespaces
from deviceplugin.model.log import FIELDS
from deviceplugin.runtime.options import DraServeOptions
from tests.draplugin import DRIVER, Node, run
from tests.test_dra_mps import (
    WHOLE,
    claim_of,
    edits,
    home,
    mps,
    mps_driver,
    pid_file,
    prepared,
    recorded,
)

SHARES = (
    "5f0c2a8e-1b3d-4e6f-8a9b-0c1d2e3f4a5b",
    "6a1d3b9f-2c4e-4f70-9bac-1d2e3f4a5b6c",
    "7b2e4c0a-3d5f-4081-8cbd-2e3f4a5b6c7d",
    "8c3f5d1b-4e60-4192-9dce-3f4a5b6c7d8e",
)
GROUP = (("tenant-a", "tenant-b"),)


def share_of(namespace: str, name: str, index: int) -> dict[str, Any]:
    """An MPS claim of `namespace` on 8 GiB of the GPU, with the share `SHARES[index]`."""
    return claim_of(name, mps(), share=SHARES[index], memory="8Gi", namespace=namespace)


async def refused(node: Node, body: dict[str, Any]) -> str:
    ref = node.add_claim(body)
    error = (await node.watcher.prepare(DRIVER, [ref])).claims[ref[2]].error
    assert error, f"{ref} was prepared"
    assert not any(node.cdi_dir.glob(f"*{ref[2]}*")), "a refused claim has no CDI spec"
    return error


def mounted(node: Node, ref: tuple[str, str, str]) -> dict[str, str]:
    """Container path -> host path of the claim's CDI device's mounts."""
    return {m["containerPath"]: m["hostPath"] for m in edits(node, ref)["mounts"]}


def test_another_namespace_is_refused_a_daemon_naming_the_one_it_serves() -> None:
    async def body() -> None:
        async with mps_driver("memory") as node:
            first, second = await prepared(
                node, share_of("tenant-a", "one", 0), share_of("tenant-a", "two", 1)
            )
            assert recorded(node)[first[2]] == recorded(node)[second[2]]  # one daemon
            assert mounted(node, first) == mounted(node, second)  # one pipe and shm
            error = await refused(node, share_of("tenant-b", "other", 2))
            assert error == (
                f"ResourceClaim tenant-b/other: {WHOLE} runs an MPS daemon for namespace"
                " tenant-a; a claim of namespace tenant-b may not share it: the clients of one"
                " MPS daemon can read each other's shared memory and stop or reconfigure the"
                " daemon (--mps-shared-namespaces lists namespaces that may share one)"
            )
            # in one NodePrepareResources call too: the first claim's namespace has the daemon
            ref_c, ref_d = (node.add_claim(share_of(n, n, 2 + i)) for i, n in enumerate("cd"))
            await node.watcher.unprepare(DRIVER, [first, second])
            done = await node.watcher.prepare(DRIVER, [ref_c, ref_d])
            assert done.claims[ref_c[2]].error == ""
            assert "runs an MPS daemon for namespace c;" in done.claims[ref_d[2]].error

    run(body)


def test_a_group_of_namespaces_shares_one_daemon_and_refuses_the_others() -> None:
    async def body() -> None:
        async with mps_driver("memory", GROUP) as node:
            first, second = await prepared(
                node, share_of("tenant-a", "one", 0), share_of("tenant-b", "two", 1)
            )
            assert recorded(node)[first[2]] == recorded(node)[second[2]]
            assert mounted(node, first) == mounted(node, second)
            error = await refused(node, share_of("tenant-c", "three", 2))
            assert f"{WHOLE} runs an MPS daemon for namespaces tenant-a, tenant-b;" in error

    run(body)


def test_once_a_namespace_has_left_the_next_starts_a_fresh_daemon_in_fresh_directories() -> None:
    async def body() -> None:
        async with mps_driver("memory") as node:
            (first,) = await prepared(node, share_of("tenant-a", "one", 0))
            pid = pid_file(node, WHOLE)
            for where in ("pipe", "shm", "log"):  # what the tenant's clients leave there
                (home(node, WHOLE) / where / "tenant-a-was-here").write_text("secret")
            await node.watcher.unprepare(DRIVER, [first])
            assert not home(node, WHOLE).exists()

            (second,) = await prepared(node, share_of("tenant-b", "two", 1))
            assert pid_file(node, WHOLE) != pid
            assert not list(home(node, WHOLE).glob("*/tenant-a-was-here"))
            await node.watcher.unprepare(DRIVER, [second])

            # a home a former daemon's removal left behind is not inherited either
            (home(node, WHOLE) / "shm").mkdir(parents=True)
            (home(node, WHOLE) / "shm" / "left-behind").write_text("secret")
            (third,) = await prepared(node, share_of("tenant-c", "three", 2))
            assert not (home(node, WHOLE) / "shm" / "left-behind").exists()
            assert mounted(node, third)["/dev/shm"] == str(home(node, WHOLE) / "shm")

    run(body)


def test_a_restarted_driver_keeps_the_boundary_and_logs_a_daemon_its_groups_forbid(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def body() -> None:
        async with mps_driver("memory", GROUP) as node:
            await prepared(node, share_of("tenant-a", "one", 0))
            await node.restart()
            assert "namespace tenant-a;" in await refused(node, share_of("tenant-c", "c", 1))
            await prepared(node, share_of("tenant-b", "two", 1))

            # restarted without the group: the daemon serves two namespaces that may not share
            node.settings = replace(node.settings, mps_shared_namespaces=())
            with caplog.at_level(logging.ERROR, logger="deviceplugin.dra.mpsdevices"):
                await node.restart()
            mixed = [getattr(r, FIELDS) for r in caplog.records if r.msg == "dra.mps.tenants_mixed"]
            assert [(m["device"], m["namespaces"]) for m in mixed] == [(WHOLE, "tenant-a,tenant-b")]
            error = await refused(node, share_of("tenant-a", "three", 2))
            assert "runs an MPS daemon for namespace tenant-b;" in error

    run(body)


def test_the_flag_takes_groups_and_refuses_bad_values_naming_the_group(
    capsys: pytest.CaptureFixture[str],
) -> None:
    command = ["dra", "serve", "--simulate", "a100-80gb-x8-mixed"]
    options = parse_options([*command, "--mps-shared-namespaces", " a, b ;c,d,e"], {})
    assert isinstance(options, DraServeOptions)
    assert options.mps_shared_namespaces == (("a", "b"), ("c", "d", "e"))
    options = parse_options(command, {"DP_DRA_MPS_SHARED_NAMESPACES": "x,y"})
    assert isinstance(options, DraServeOptions)
    assert options.mps_shared_namespaces == (("x", "y"),)
    assert shared_namespaces(None) == shared_namespaces("") == ()
    for value, words in [
        ("a,b;", "group 2 ('') has an empty namespace name"),
        ("a,,b", "group 1 ('a,,b') has an empty namespace name"),
        ("a;b", "group 1 ('a') names one namespace"),
        ("a,Team_B", "group 1 ('a,Team_B'): 'Team_B' is not a DNS label"),
        ("a,b;b,c", "group 2 ('b,c'): namespace b is in group 1 as well"),
        ("a,b,a", "group 1 ('a,b,a'): namespace a is named twice"),
    ]:
        with pytest.raises(SystemExit) as stopped:
            parse_options([*command, "--mps-shared-namespaces", value], {})
        assert stopped.value.code == 2
        err = capsys.readouterr().err
        assert f"--mps-shared-namespaces / DP_DRA_MPS_SHARED_NAMESPACES: {words}" in err, err
