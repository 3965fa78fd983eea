"""A claim's opaque config written to be expensive, over the real DRA socket with claims from the
API-server stand-in: a quantity with a huge exponent, an integer past 2^63-1, more entries,
requests, per-device limits, bytes or nesting than Kubernetes keeps. Each fails its own claim
at once with the field's path, and the other claim of the batch is prepared. A parse that
does not end in time fails its claim alone too, and meanwhile another Prepare on the node goes
on: the config is read in a worker thread with a deadline, before the node's lock."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from typing import Any

import pytest

from deviceplugin.dra import prepare
from deviceplugin.dra.opaque import API_VERSION
from tests.draplugin import DRIVER, claim, run, running_driver
from tests.test_dra_claim_config import WHOLE, configured, gpu_config

CONFIG = "status.allocation.devices.config"
BAD = f"{CONFIG}[0].opaque.parameters"
MPS_CONFIG = f"{BAD}.sharing.mpsConfig"


def mps_limits(**limits: Any) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "GpuConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": limits},
    }


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"a": value}
    return value


def entries(count: int) -> list[tuple[str, list[str], Any]]:
    return [("FromClaim", [], gpu_config("Short"))] * count


@pytest.mark.parametrize(
    ("config", "error"),
    [
        pytest.param(
            [("FromClaim", [], mps_limits(defaultPinnedDeviceMemoryLimit="1e999999"))],
            f"{MPS_CONFIG}.defaultPinnedDeviceMemoryLimit: '1e999999' is out of range",
            id="huge-exponent",
        ),
        pytest.param(
            [("FromClaim", [], mps_limits(defaultPinnedDeviceMemoryLimit="1e999999999999"))],
            f"{MPS_CONFIG}.defaultPinnedDeviceMemoryLimit: '1e999999999999' is out of range",
            id="decimal-overflow",
        ),
        pytest.param(
            [("FromClaim", [], mps_limits(defaultPerDevicePinnedMemoryLimit={"0": "9e99999"}))],
            f"{MPS_CONFIG}.defaultPerDevicePinnedMemoryLimit: 0: '9e99999' is out of range",
            id="per-device-exponent",
        ),
        pytest.param(
            [("FromClaim", [], mps_limits(defaultPinnedDeviceMemoryLimit=10**30))],
            f"{MPS_CONFIG}.defaultPinnedDeviceMemoryLimit: is out of range: a number is at most"
            " 2^63-1",
            id="huge-integer",
        ),
        pytest.param(
            [
                (
                    "FromClaim",
                    [],
                    mps_limits(
                        defaultPerDevicePinnedMemoryLimit={str(i): "1Gi" for i in range(33)}
                    ),
                )
            ],
            f"{MPS_CONFIG}.defaultPerDevicePinnedMemoryLimit: has 33 entries, more than the 32",
            id="per-device-entries",
        ),
        pytest.param(
            entries(65),
            f"{CONFIG}: has 65 entries, more than the 64 allowed",
            id="config-entries",
        ),
        pytest.param(
            [("FromClaim", [f"r{i}" for i in range(33)], gpu_config())],
            f"{CONFIG}[0].requests: has 33 requests, more than the 32 allowed",
            id="requests",
        ),
        pytest.param(
            [("FromClaim", ["r" * 200], gpu_config())],
            f"{CONFIG}[0].requests[0]: must be a request name of 1 to 127 characters",
            id="request-name",
        ),
        pytest.param(
            [("FromClaim", [], {**gpu_config(), "note": "x" * 11000})],
            f"{BAD}: is larger than 10 KiB as JSON",
            id="parameters-size",
        ),
        pytest.param(
            [("FromClaim", [], {**gpu_config(), "sharing": nested(40)})],
            f"{BAD}.sharing{'.a' * 16}: is nested deeper than 16 levels",
            id="nesting",
        ),
    ],
)
def test_a_hostile_config_fails_its_claim_with_the_field_and_the_other_claim_prepares(
    config: list[tuple[str, list[str], Any]], error: str
) -> None:
    async def body() -> None:
        async with running_driver() as node:
            bad = node.add_claim(configured(claim("hostile", [("gpu", WHOLE[0])]), *config))
            good = node.add_claim(claim("ordinary", [("gpu", WHOLE[1])]))
            response = await node.watcher.prepare(DRIVER, [bad, good])
            assert response.claims[bad[2]].error.startswith(
                f"ResourceClaim default/hostile: {error}"
            )
            assert response.claims[good[2]].error == ""
            assert [p.name for p in node.cdi_dir.glob("*.json")] == [
                f"k8s.gpu.nvidia.com-claim_{good[2]}.json"
            ]

    run(body)


def test_a_config_not_read_in_time_fails_its_claim_alone_while_the_node_prepares_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A parse that hangs stands for one the bounds missed: its claim fails at the deadline,
    the other claim of its batch is prepared, and another batch is prepared while it hangs."""
    entered, release = threading.Event(), threading.Event()
    read_entries = prepare.read_entries

    def hanging(devices: Mapping[str, Any], driver: str) -> list[Any]:
        if devices.get("config"):  # the slow claim's; the others have none
            entered.set()
            release.wait(10)
        return read_entries(devices, driver)

    monkeypatch.setattr(prepare, "read_entries", hanging)
    monkeypatch.setattr(prepare, "CONFIG_SECONDS", 1.0)

    async def body() -> None:
        async with running_driver() as node:
            slow = node.add_claim(configured(claim("slow", [("gpu", WHOLE[0])]), *entries(1)))
            good = node.add_claim(claim("good", [("gpu", WHOLE[1])]))
            other = node.add_claim(claim("other", [("gpu", WHOLE[2])]))
            try:
                batch = asyncio.create_task(node.watcher.prepare(DRIVER, [slow, good]))
                assert await asyncio.to_thread(entered.wait, 30)
                meanwhile = await node.watcher.prepare(DRIVER, [other])
                assert not release.is_set()
                assert meanwhile.claims[other[2]].error == ""
                response = await batch
            finally:
                release.set()
            assert response.claims[slow[2]].error == (
                f"ResourceClaim default/slow: {CONFIG}: not read within 1 s"
            )
            assert response.claims[good[2]].error == ""

    run(body)
