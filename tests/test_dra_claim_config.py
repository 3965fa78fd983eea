"""What a claim's allocation says, honoured in NodePrepareResources over the real DRA socket:
opaque configuration from the class and the claim (time-slicing, validated with the field
path), admin access, share IDs, and Prepare / Unprepare repeated and concurrent. Claims come
from the API-server stand-in, the CDI spec is read back as a runtime resolves it, and the
checkpoint as a restarted driver loads it."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from deviceplugin.dra.opaque import API_VERSION, NVIDIA_API_VERSION
from deviceplugin.model.slices import device_name
from tests.dranode import inventory
from tests.draplugin import (
    DRIVER,
    PRESET,
    claim,
    resolve,
    run,
    running_driver,
    with_admin_access,
)

FOUND = inventory(PRESET)
WHOLE = [device_name(gpu, None) for gpu in FOUND.gpus if not gpu.mig_enabled]
PARENT = next(gpu for gpu in FOUND.gpus if gpu.mig_enabled)
MIG = device_name(PARENT, PARENT.mig_devices[0])
KIND = "k8s.gpu.nvidia.com/claim"
SHARES = ("5f0c2a8e-1b3d-4e6f-8a9b-0c1d2e3f4a5b", "6a1d3b9f-2c4e-4f70-9bac-1d2e3f4a5b6c")


def env_key(device: str) -> str:
    return "DRA_" + device.upper().replace("-", "_")


def memory_share(name: str, device: str, share_id: str) -> dict[str, Any]:
    """A claim allocated a 1 GiB memory share of `device` (`--gpu-sharing memory`)."""
    body = claim(name, [("gpu", device)])
    return configured(body, shareID=share_id, consumedCapacity={"memory": "1Gi"})


def gpu_config(interval: str | None = None, api_version: str = API_VERSION) -> dict[str, Any]:
    sharing: dict[str, Any] = {"strategy": "TimeSlicing"}
    if interval is not None:
        sharing["timeSlicingConfig"] = {"interval": interval}
    return {"apiVersion": api_version, "kind": "GpuConfig", "sharing": sharing}


def configured(
    body: dict[str, Any],
    *entries: tuple[str, list[str], Any],
    driver: str = DRIVER,
    **result_fields: Any,
) -> dict[str, Any]:
    """`body` (from `claim`) with config entries (source, requests, parameters) and extra fields
    on every allocation result."""
    devices = body["status"]["allocation"]["devices"]
    devices["config"] = [
        {"source": source, "requests": requests, "opaque": {"driver": driver, "parameters": p}}
        for source, requests, p in entries
    ]
    for result in devices["results"]:
        result.update(result_fields)
    return body


def test_time_slicing_reaches_the_cdi_device_and_the_checkpoint_and_survives_a_restart() -> None:
    async def body() -> None:
        async with running_driver() as node:
            ref = node.add_claim(
                configured(
                    claim("sliced", [("gpu", WHOLE[0])]),
                    ("FromClaim", ["gpu"], gpu_config("Short")),
                )
            )
            uid = ref[2]
            first = await node.watcher.prepare(DRIVER, [ref])
            assert first.claims[uid].error == ""
            env = resolve(node.cdi_dir, f"{KIND}={uid}-{WHOLE[0]}")["env"]
            assert f"{env_key(WHOLE[0])}_SHARING_STRATEGY=TimeSlicing" in env
            assert f"{env_key(WHOLE[0])}_TIMESLICE_INTERVAL=Short" in env
            saved = json.loads(
                (node.kubelet_root / "plugins" / DRIVER / "checkpoint.json").read_text()
            )
            (device,) = saved["data"]["claims"][uid]["devices"]
            assert device["sharing"] == "TimeSlicing" and device["timeSliceInterval"] == "Short"

            await node.restart()
            assert node.driver.preparer is not None
            (prepared,) = node.driver.preparer.prepared[uid].devices
            assert (prepared.sharing, prepared.interval) == ("TimeSlicing", "Short")

    run(body)


def test_a_claim_entry_overrides_its_class_and_covers_only_its_requests() -> None:
    async def body() -> None:
        async with running_driver() as node:
            ref = node.add_claim(
                configured(
                    claim("two", [("a", WHOLE[0]), ("b", WHOLE[1])]),
                    ("FromClaim", ["a"], gpu_config("Medium")),
                    ("FromClass", [], gpu_config("Long", NVIDIA_API_VERSION)),
                )
            )
            uid = ref[2]
            assert (await node.watcher.prepare(DRIVER, [ref])).claims[uid].error == ""
            a = resolve(node.cdi_dir, f"{KIND}={uid}-{WHOLE[0]}")["env"]
            b = resolve(node.cdi_dir, f"{KIND}={uid}-{WHOLE[1]}")["env"]
            assert f"{env_key(WHOLE[0])}_TIMESLICE_INTERVAL=Medium" in a
            assert f"{env_key(WHOLE[1])}_TIMESLICE_INTERVAL=Long" in b  # NVIDIA's API, as is
            assert not any(e.startswith(env_key(WHOLE[1])) for e in a)

    run(body)


def test_a_mig_device_takes_a_mig_device_config_and_refuses_a_gpu_config() -> None:
    async def body() -> None:
        async with running_driver() as node:
            mig_config = {
                "apiVersion": API_VERSION,
                "kind": "MigDeviceConfig",
                "sharing": {"strategy": "TimeSlicing"},
            }
            good = node.add_claim(
                configured(claim("mig", [("mig", MIG)]), ("FromClaim", [], mig_config))
            )
            wrong = node.add_claim(
                configured(claim("wrong", [("mig", MIG)]), ("FromClaim", [], gpu_config()))
            )
            response = await node.watcher.prepare(DRIVER, [good, wrong])
            assert response.claims[good[2]].error == ""
            env = resolve(node.cdi_dir, f"{KIND}={good[2]}-{MIG}")["env"]
            assert f"{env_key(MIG)}_SHARING_STRATEGY=TimeSlicing" in env
            assert not any("TIMESLICE_INTERVAL" in e for e in env)
            assert response.claims[wrong[2]].error == (
                "ResourceClaim default/wrong: status.allocation.devices.config[0].opaque."
                f"parameters.kind: GpuConfig does not apply to {MIG} (request 'mig'), a MIG "
                "device; use MigDeviceConfig"
            )

    run(body)


BAD = "status.allocation.devices.config[0].opaque.parameters"


@pytest.mark.parametrize(
    ("parameters", "error"),
    [
        pytest.param(
            gpu_config("Fast"),
            f"{BAD}.sharing.timeSlicingConfig.interval: must be 'Default', 'Short', 'Medium' or"
            " 'Long', got 'Fast'",
            id="interval",
        ),
        pytest.param(
            {**gpu_config(), "sharing": {"strategy": "Mps"}},
            f"{BAD}.sharing.strategy: must be 'TimeSlicing' or 'MPS', got 'Mps'",
            id="strategy",
        ),
        pytest.param(
            {**gpu_config(), "sharing": {"strategy": "TimeSlicing", "replicas": 4}},
            f"{BAD}.sharing.replicas: is not a field of this API",
            id="unknown-field",
        ),
        pytest.param(
            gpu_config(api_version="gpu.nvidia.com/v1"),
            f"{BAD}.apiVersion: must be {API_VERSION} (or NVIDIA's {NVIDIA_API_VERSION}), got"
            " 'gpu.nvidia.com/v1'",
            id="api-version",
        ),
        pytest.param(
            {**gpu_config(), "kind": "VfioDeviceConfig"},
            f"{BAD}.kind: must be GpuConfig or MigDeviceConfig, got 'VfioDeviceConfig'",
            id="kind",
        ),
        pytest.param(
            {**gpu_config(), "sharing": {"strategy": 2}},
            f"{BAD}.sharing.strategy: must be a string, got 2",
            id="type",
        ),
    ],
)
def test_a_bad_config_fails_its_claim_naming_the_field_and_the_others_prepare(
    parameters: dict[str, Any], error: str
) -> None:
    async def body() -> None:
        async with running_driver() as node:
            bad = node.add_claim(
                configured(claim("bad", [("gpu", WHOLE[0])]), ("FromClaim", [], parameters))
            )
            good = node.add_claim(claim("good", [("gpu", WHOLE[1])]))
            response = await node.watcher.prepare(DRIVER, [bad, good])
            assert response.claims[bad[2]].error == f"ResourceClaim default/bad: {error}"
            assert response.claims[good[2]].error == ""
            assert [p.name for p in node.cdi_dir.glob("*.json")] == [
                f"k8s.gpu.nvidia.com-claim_{good[2]}.json"
            ]

    run(body)


def test_another_drivers_config_is_not_ours_to_read() -> None:
    async def body() -> None:
        async with running_driver() as node:
            ref = node.add_claim(
                configured(
                    claim("mixed", [("gpu", WHOLE[0])]),
                    ("FromClaim", [], {"anything": "goes"}),
                    driver="net.example.com",
                )
            )
            assert (await node.watcher.prepare(DRIVER, [ref])).claims[ref[2]].error == ""
            env = resolve(node.cdi_dir, f"{KIND}={ref[2]}-{WHOLE[0]}")["env"]
            assert not any(e.startswith(env_key(WHOLE[0])) for e in env)

    run(body)


def test_admin_access_gets_the_device_as_it_is_beside_the_claim_that_owns_it() -> None:
    async def body() -> None:
        async with running_driver() as node:
            owner = node.add_claim(
                configured(
                    claim("owner", [("gpu", WHOLE[0])]), ("FromClaim", [], gpu_config("Short"))
                )
            )
            monitor = node.add_claim(
                with_admin_access(
                    configured(
                        claim("monitor", [("gpu", WHOLE[0])], namespace="monitoring"),
                        ("FromClaim", [], gpu_config("Long")),  # not applied to a monitor
                    )
                )
            )
            response = await node.watcher.prepare(DRIVER, [owner, monitor])
            assert {uid: e.error for uid, e in response.claims.items()} == {
                owner[2]: "",
                monitor[2]: "",
            }
            seen = resolve(node.cdi_dir, f"{KIND}={monitor[2]}-{WHOLE[0]}")
            assert f"{env_key(WHOLE[0])}_ADMIN_ACCESS=true" in seen["env"]
            assert not any("SHARING_STRATEGY" in e for e in seen["env"])
            assert any(n["path"].startswith("/dev/nvidia") for n in seen["deviceNodes"])
            owned = resolve(node.cdi_dir, f"{KIND}={owner[2]}-{WHOLE[0]}")["env"]
            assert f"{env_key(WHOLE[0])}_TIMESLICE_INTERVAL=Short" in owned
            assert node.driver.preparer is not None
            (device,) = node.driver.preparer.prepared[monitor[2]].devices
            assert device.admin_access and device.sharing == ""

    run(body)


def test_shares_of_one_device_get_their_own_cdi_devices_and_v1_names_the_share() -> None:
    async def body() -> None:
        async with running_driver(gpu_sharing="memory") as node:
            refs = [
                node.add_claim(memory_share(f"share-{n}", WHOLE[0], s))
                for n, s in enumerate(SHARES)
            ]
            v1 = await node.watcher.prepare(DRIVER, refs, version="v1.DRAPlugin")
            for ref, share in zip(refs, SHARES, strict=True):
                (device,) = v1.claims[ref[2]].devices
                assert device.share_id == share
                assert list(device.cdi_device_ids) == [f"{KIND}={ref[2]}-{WHOLE[0]}-{share}"]
                env = resolve(node.cdi_dir, device.cdi_device_ids[0])["env"]
                assert f"{env_key(WHOLE[0])}_SHARE_ID={share}" in env
            beta = await node.watcher.prepare(DRIVER, refs[:1], version="v1beta1.DRAPlugin")
            (device,) = beta.claims[refs[0][2]].devices
            assert "share_id" not in device.DESCRIPTOR.fields_by_name  # v1beta1 cannot say it
            assert list(device.cdi_device_ids) == [f"{KIND}={refs[0][2]}-{WHOLE[0]}-{SHARES[0]}"]

            bad = node.add_claim(memory_share("bad-share", WHOLE[1], "s1"))
            error = (await node.watcher.prepare(DRIVER, [bad])).claims[bad[2]].error
            assert error.startswith(
                "ResourceClaim default/bad-share: status.allocation.devices.results[0].shareID:"
                " 's1' is not a UID"
            )

    run(body)


def test_a_device_is_prepared_for_one_claim_unless_admin_access_or_shares_share_it() -> None:
    async def body() -> None:
        async with running_driver(gpu_sharing="memory") as node:
            owner = node.add_claim(claim("owner", [("gpu", WHOLE[0])]))
            taken = node.add_claim(claim("taken", [("gpu", WHOLE[0])]))
            monitor = node.add_claim(with_admin_access(claim("monitor", [("gpu", WHOLE[0])])))
            shares = [
                node.add_claim(memory_share(f"share-{n}", WHOLE[1], s))
                for n, s in enumerate([SHARES[0], SHARES[1], SHARES[0]])
            ]
            response = await node.watcher.prepare(DRIVER, [owner, taken, monitor, *shares])
            errors = {uid: e.error for uid, e in response.claims.items()}
            assert errors[taken[2]] == (
                "ResourceClaim default/taken: status.allocation.devices.results[0]:"
                f" {WHOLE[0]} is already prepared for ResourceClaim"
                " default/owner; claims share a device only with admin access or each with its"
                " own memory share"
            )
            assert errors[shares[2][2]].endswith(
                f"{WHOLE[1]} is already prepared for ResourceClaim default/share-0; claims share"
                " a device only with admin access or each with its own memory share"
            )
            assert {uid for uid, error in errors.items() if error} == {taken[2], shares[2][2]}
            assert len(list(node.cdi_dir.glob("*.json"))) == 4

            await node.watcher.unprepare(DRIVER, [owner])
            assert (await node.watcher.prepare(DRIVER, [taken])).claims[taken[2]].error == ""

    run(body)


def test_concurrent_and_repeated_prepare_and_unprepare_agree_and_leave_one_state() -> None:
    async def body() -> None:
        async with running_driver() as node:
            ref = node.add_claim(
                configured(claim("busy", [("gpu", WHOLE[0])]), ("FromClaim", [], gpu_config()))
            )
            elsewhere = [*WHOLE[1:], MIG]  # one device per claim: none is shared
            others = [
                node.add_claim(claim(f"other-{n}", [("gpu", d)])) for n, d in enumerate(elsewhere)
            ]
            calls = [node.watcher.prepare(DRIVER, [ref]) for _ in range(8)]
            calls += [node.watcher.prepare(DRIVER, [other]) for other in others]
            answers = await asyncio.gather(*calls)
            assert all(a == answers[0] for a in answers[:8])
            assert answers[0].claims[ref[2]].error == ""
            assert node.driver.preparer is not None
            assert set(node.driver.preparer.prepared) == {ref[2], *(o[2] for o in others)}
            saved = json.loads(
                (node.kubelet_root / "plugins" / DRIVER / "checkpoint.json").read_text()
            )
            assert set(saved["data"]["claims"]) == set(node.driver.preparer.prepared)
            assert len(list(node.cdi_dir.glob("*.json"))) == 5

            done = await asyncio.gather(
                *(node.watcher.unprepare(DRIVER, [ref, *others]) for _ in range(6))
            )
            assert all(e.error == "" for d in done for e in d.claims.values())
            assert node.driver.preparer.prepared == {}
            assert list(node.cdi_dir.glob("*.json")) == []

            again = await node.watcher.prepare(DRIVER, [ref])  # after Unprepare: prepared anew
            assert again == answers[0]
            assert len(list(node.cdi_dir.glob("*.json"))) == 1

    run(body)
