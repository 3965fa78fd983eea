"""GPU memory shares (`dra serve --gpu-sharing memory`): whole GPUs published shareable to the
API-server stand-in (which validates every slice against the v1 schema), MIG devices not; the
option's flag and variable; the manifests; and Prepare over the real DRA socket writing one CDI
device per share with the toolkit's memory limit, refusing what cannot be a share."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from deviceplugin.cli import parse_options
from deviceplugin.dra.opaque import API_VERSION
from deviceplugin.model.memoryshares import GPU_SHARING_ENV, SHARE_MIN, SHARE_STEP, GpuSharing
from deviceplugin.model.quantity import parse_quantity
from deviceplugin.model.slices import device_name
from deviceplugin.runtime.options import DraServeOptions, ExplainOptions
from tests.dranode import inventory
from tests.draplugin import DRIVER, PRESET, claim, published, resolve, run, running_driver

ROOT = Path(__file__).resolve().parent.parent
FOUND = inventory(PRESET)
WHOLE_GPU = next(gpu for gpu in FOUND.gpus if not gpu.mig_enabled)
WHOLE = device_name(WHOLE_GPU, None)
PARENT = next(gpu for gpu in FOUND.gpus if gpu.mig_enabled)
MIG = device_name(PARENT, PARENT.mig_devices[0])
KIND = "k8s.gpu.nvidia.com/claim"
SHARES = ("5f0c2a8e-1b3d-4e6f-8a9b-0c1d2e3f4a5b", "6a1d3b9f-2c4e-4f70-9bac-1d2e3f4a5b6c")


def test_whole_gpus_are_published_shareable_and_mig_devices_keep_their_size() -> None:
    async def body() -> None:
        async with running_driver(gpu_sharing="memory") as node:
            devices = published(node.server)
            assert node.server.rejected == []
            whole = devices[WHOLE]
            total = WHOLE_GPU.memory_mib << 20
            assert whole["allowMultipleAllocations"] is True
            memory = whole["capacity"]["memory"]
            assert parse_quantity(memory["value"]) == total
            policy = memory["requestPolicy"]
            assert parse_quantity(policy["default"]) == total  # no request: the GPU alone
            bounds = {k: parse_quantity(v) for k, v in policy["validRange"].items()}
            assert bounds == {"min": SHARE_MIN, "max": total, "step": SHARE_STEP}
            # what the API server requires of a range (validateRequestPolicyRange)
            assert (total - SHARE_MIN) % SHARE_STEP == 0
            assert whole["attributes"]["nvidia.com/memoryShares"] == {"bool": True}
            mig = devices[MIG]
            assert "allowMultipleAllocations" not in mig
            assert "requestPolicy" not in mig["capacity"]["memory"]
            assert mig["attributes"]["nvidia.com/memoryShares"] == {"bool": False}

    run(body)


def test_without_the_option_nothing_is_shareable() -> None:
    async def body() -> None:
        async with running_driver() as node:
            for device in published(node.server).values():
                assert "allowMultipleAllocations" not in device
                assert "nvidia.com/memoryShares" not in device["attributes"]

    run(body)


@pytest.mark.parametrize("command", [["dra", "serve"], ["dra", "explain", "--class", "c.yaml"]])
def test_the_flag_beats_the_variable_and_a_bad_value_is_refused(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    options = parse_options(command, {GPU_SHARING_ENV: "memory"})
    assert isinstance(options, DraServeOptions | ExplainOptions)
    assert options.gpu_sharing == "memory"
    options = parse_options([*command, "--gpu-sharing", "off"], {GPU_SHARING_ENV: "memory"})
    assert isinstance(options, DraServeOptions | ExplainOptions)
    assert options.gpu_sharing == "off"
    with pytest.raises(SystemExit) as exit_info:
        parse_options([*command, "--gpu-sharing", "mps"], {})
    assert exit_info.value.code == 2
    assert "--gpu-sharing / DP_DRA_GPU_SHARING must be off or memory" in capsys.readouterr().err


def test_the_shares_overlay_turns_sharing_on_over_the_simulated_node() -> None:
    overlay = ROOT / "manifests" / "overlays" / "simulated-node-dra-shares"
    kustomization = yaml.safe_load((overlay / "kustomization.yaml").read_text())
    assert kustomization["resources"] == ["../simulated-node-dra"]
    (patch,) = kustomization["patches"]
    daemonset = yaml.safe_load((overlay / patch["path"]).read_text())
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    assert {"name": GPU_SHARING_ENV, "value": "memory"} in container["env"]
    # Unprepare's clear writes the simulated library's state: the base overlay has it writable
    # under the read-only node.
    state = "/var/lib/deviceplugin-sim/root/etc/deviceplugin-sim"
    base_patch = ROOT / "manifests" / "overlays" / "simulated-node-dra" / "simulated-node.yaml"
    spec = yaml.safe_load(base_patch.read_text())["spec"]["template"]["spec"]
    (mount,) = (m for m in spec["containers"][0]["volumeMounts"] if m["mountPath"] == state)
    assert not mount.get("readOnly")
    (volume,) = (v for v in spec["volumes"] if v["name"] == mount["name"])
    assert volume["hostPath"]["path"] == state
    base = yaml.safe_load((ROOT / "manifests" / "dra" / "Kustomization").read_text())
    assert "deviceclasses-shares.yaml" in base["resources"]


def test_the_shared_classes_name_their_extended_resource() -> None:
    path = ROOT / "manifests" / "dra" / "deviceclasses-shares.yaml"
    classes = {d["metadata"]["name"]: d["spec"] for d in yaml.safe_load_all(path.read_text())}
    assert set(classes) == {"gpu-shared.nvidia.com", "gpu-shared-extended.nvidia.com"}
    extended = classes["gpu-shared-extended.nvidia.com"]
    assert extended["extendedResourceName"] == "nvidia.com/gpu.shared"


# --- Prepare ------------------------------------------------------------------------------------


def shared(name: str, *shares: tuple[str, str, str], config: Any = None) -> dict[str, Any]:
    """A claim allocated (device, share ID, consumed memory) shares, one request each."""
    body = claim(name, [(f"r{i}", device) for i, (device, _, _) in enumerate(shares)])
    results = body["status"]["allocation"]["devices"]["results"]
    for result, (_, share, memory) in zip(results, shares, strict=True):
        if share:
            result["shareID"] = share
        if memory:
            result["consumedCapacity"] = {"memory": memory}
    if config is not None:
        body["status"]["allocation"]["devices"]["config"] = [
            {
                "source": "FromClaim",
                "requests": [],
                "opaque": {"driver": DRIVER, "parameters": config},
            }
        ]
    return body


def test_each_share_gets_its_own_cdi_device_with_its_memory_limit() -> None:
    async def body() -> None:
        async with running_driver(gpu_sharing="memory") as node:
            one = node.add_claim(shared("one", (WHOLE, SHARES[0], "10Gi")))
            two = node.add_claim(shared("two", (WHOLE, SHARES[1], "20Gi")))
            done = await node.watcher.prepare(DRIVER, [one, two])
            for ref, share, limit in ((one, SHARES[0], 10 << 30), (two, SHARES[1], 20 << 30)):
                uid = ref[2]
                assert done.claims[uid].error == ""
                (device,) = done.claims[uid].devices
                assert list(device.cdi_device_ids) == [f"{KIND}={uid}-{WHOLE}-{share}"]
                env = resolve(node.cdi_dir, f"{KIND}={uid}-{WHOLE}-{share}")["env"]
                assert f"NVIDIA_GPU_MEMORY_LIMIT={limit}" in env
                assert f"DRA_{WHOLE.upper().replace('-', '_')}_SHARE_ID={share}" in env

    run(body)


@pytest.mark.parametrize(
    ("sharing", "share", "fragment"),
    [
        ("memory", (MIG, SHARES[0], "5Gi"), f".shareID: {MIG} is a MIG device"),
        ("memory", (MIG, "", "5Gi"), f".consumedCapacity: {MIG} is a MIG device"),
        ("off", (WHOLE, "", "5Gi"), f".consumedCapacity: {WHOLE} is not published shareable"),
        ("memory", (WHOLE, SHARES[0], ""), ".consumedCapacity.memory: required"),
        ("memory", (WHOLE, SHARES[0], "lots"), "'lots' is not a quantity"),
        ("memory", (WHOLE, "", "5Gi"), ".shareID: required with consumedCapacity"),
    ],
    ids=[
        "mig-share",
        "mig-capacity",
        "not-shareable",
        "no-memory",
        "bad",
        "no-id",
    ],
)
def test_what_cannot_be_a_share_is_refused_at_prepare(
    sharing: GpuSharing, share: tuple[str, str, str], fragment: str
) -> None:
    async def body() -> None:
        async with running_driver(gpu_sharing=sharing) as node:
            ref = node.add_claim(shared("refused", share))
            done = await node.watcher.prepare(DRIVER, [ref])
            error = done.claims[ref[2]].error
            assert "status.allocation.devices.results[0]" in error and fragment in error, error
            assert not list(node.cdi_dir.glob("*.json"))

    run(body)


def test_time_slicing_a_shared_gpu_is_refused_at_prepare() -> None:
    config = {
        "apiVersion": API_VERSION,
        "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing"},
    }

    async def body() -> None:
        async with running_driver(gpu_sharing="memory") as node:
            ref = node.add_claim(shared("sliced", (WHOLE, SHARES[0], "4Gi"), config=config))
            done = await node.watcher.prepare(DRIVER, [ref])
            error = done.claims[ref[2]].error
            assert "asks for time-slicing on a memory share" in error, error
            assert "status.allocation.devices.config[0]" in error

    run(body)
