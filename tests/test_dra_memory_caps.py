"""A memory share's cap (`dra serve --gpu-sharing memory`, production path on the simulated
libnvidia-ml.so.1): Prepare over the real DRA socket names the driver's memory-limit hook in the
share's CDI device; the hook, run from that spec as a runtime runs it, caps this process's
pod's cgroup on the GPU (tests/hookview.py); Unprepare clears exactly the caps recorded, on
every GPU they name, through NVML, after a driver restart too, and sets back what another
claim's share in the same pod still holds. A GPU whose NVML has no per-cgroup limits is refused
at Prepare."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from test_sim_library_memory_limits import GIB

from deviceplugin.dra.memorylimits import HOOK_FILE, LOCK_FILE, RECORDS_DIR, clear_claim
from deviceplugin.model.log import FIELDS
from deviceplugin.model.slices import device_name
from deviceplugin.sim.hostroot import LIBRARY_DIR
from tests.dranode import inventory
from tests.draplugin import DRIVER, PRESET, Node, claim, run, running_driver
from tests.hookview import OTHER_POD, POD, HookView, run_hook

FOUND = inventory(PRESET)
WHOLE_GPU = next(gpu for gpu in FOUND.gpus if not gpu.mig_enabled)
WHOLE = device_name(WHOLE_GPU, None)
SHARE = "5f0c2a8e-1b3d-4e6f-8a9b-0c1d2e3f4a5b"
OTHER_SHARE = "6a1d3b9f-2c4e-4f70-9bac-1d2e3f4a5b6c"
NO_LIMITS_NODE = """\
gpus:
  - uuid: GPU-8e2f3c10-0000-4000-8000-000000000000
    name: NVIDIA A100-SXM4-80GB
    memoryMiB: 81920
    pciBusId: "00000000:07:00.0"
    notSupported: [nvmlDeviceGetMemoryLimits_v1, nvmlDeviceSetMemoryLimits_v1]
"""


def shared(name: str, device: str, memory: str, share: str = SHARE) -> dict[str, Any]:
    body = claim(name, [("gpu", device)])
    result = body["status"]["allocation"]["devices"]["results"][0]
    result["shareID"], result["consumedCapacity"] = share, {"memory": memory}
    return body


def hooks(node: Node, uid: str) -> list[dict[str, Any]]:
    (path,) = node.cdi_dir.glob(f"*{uid}.json")
    (device,) = json.loads(path.read_text())["devices"]
    return list(device["containerEdits"].get("hooks", []))


def run_spec_hook(hook: dict[str, Any], view: HookView, gpu: str = "") -> None:
    """The spec's hook as runc runs it in a pod's container (`view`); with `gpu`, for that GPU
    instead of the spec's."""
    args = list(hook["args"])
    args[5] = gpu or args[5]
    done = run_hook(hook["path"], args, view)
    assert done.returncode == 0, done.stderr


def cap(node: Node, cgroup: str, gpu: str = WHOLE_GPU.uuid) -> int | None:
    """A cgroup's cap on a GPU, read through the driver root's library."""
    script = (
        "import ctypes, os, sys, pynvml as n\n"
        "ctypes.CDLL(sys.argv[1], mode=os.RTLD_GLOBAL)\n"
        "n.nvmlInit()\n"
        "h = n.nvmlDeviceGetHandleByUUID(sys.argv[2])\n"
        "l = n.c_nvmlGetMemoryLimits_v1_t(); l.nameSpace = sys.argv[3].encode()\n"
        "try:\n"
        "    n.nvmlDeviceGetMemoryLimits_v1(h, l); print(l.hardLimit)\n"
        "except n.NVMLError_NotFound:\n"
        "    print('none')\n"
    )
    root = Path(node.settings.overrides["nvidia_driver_root"] or "")
    library = str(root / LIBRARY_DIR / "libnvidia-ml.so.1")
    done = subprocess.run(
        [sys.executable, "-c", script, library, gpu, cgroup],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return None if done.stdout.strip() == "none" else int(done.stdout)


def test_a_share_is_capped_by_the_hook_and_cleared_at_unprepare(tmp_path: Path) -> None:
    view = HookView(tmp_path)

    async def body() -> None:
        async with running_driver(gpu_sharing="memory", library=True) as node:
            plugin_dir = node.kubelet_root / "plugins" / DRIVER
            assert (plugin_dir / HOOK_FILE).stat().st_mode & 0o111
            ref = node.add_claim(shared("capped", WHOLE, "20Gi"))
            done = await node.watcher.prepare(DRIVER, [ref])
            assert done.claims[ref[2]].error == ""
            (hook,) = hooks(node, ref[2])
            assert hook["hookName"] == "createContainer"
            assert hook["path"] == str(plugin_dir / HOOK_FILE)
            assert hook["args"][3:] == [ref[2], SHARE, WHOLE_GPU.uuid, str(20 * GIB)]
            run_spec_hook(hook, view)
            assert cap(node, view.pod()) == 20 * GIB
            assert len(list((plugin_dir / RECORDS_DIR).glob("*.json"))) == 1
            await node.restart()  # the records outlive the driver
            await node.watcher.unprepare(DRIVER, [ref])
            assert cap(node, view.pod()) is None
            assert list((plugin_dir / RECORDS_DIR).glob("*.json")) == []
            assert list(node.cdi_dir.glob("*.json")) == []

    run(body)


def test_a_gpu_whose_nvml_cannot_cap_is_refused_a_share(tmp_path: Path) -> None:
    node_file = tmp_path / "node.yaml"
    node_file.write_text(NO_LIMITS_NODE)

    async def body() -> None:
        async with running_driver(str(node_file), gpu_sharing="memory", library=True) as node:
            ref = node.add_claim(shared("uncapped", "gpu-0", "20Gi"))
            done = await node.watcher.prepare(DRIVER, [ref])
            error = done.claims[ref[2]].error
            assert "status.allocation.devices.results[0].consumedCapacity.memory" in error, error
            assert "has no per-cgroup memory limits" in error, error
            assert list(node.cdi_dir.glob("*.json")) == []

    run(body)


def test_unprepare_fails_while_a_cap_cannot_be_cleared() -> None:
    async def body() -> None:
        async with running_driver(gpu_sharing="memory", library=True) as node:
            records = node.kubelet_root / "plugins" / DRIVER / RECORDS_DIR
            ref = node.add_claim(shared("stuck", WHOLE, "4Gi"))
            assert (await node.watcher.prepare(DRIVER, [ref])).claims[ref[2]].error == ""
            bad = records / f"{ref[2]}_{SHARE}_0.json"
            bad.write_text(json.dumps({"gpu": "GPU-no-such", "nameSpace": "/x", "limit": GIB}))
            done = await node.watcher.unprepare(DRIVER, [ref])
            assert "GPU-no-such" in done.claims[ref[2]].error
            assert bad.exists() and list(node.cdi_dir.glob("*.json"))  # the kubelet retries
            bad.unlink()
            assert (await node.watcher.unprepare(DRIVER, [ref])).claims[ref[2]].error == ""

    run(body)


def test_unprepare_clears_the_caps_a_share_has_on_every_gpu_recorded(tmp_path: Path) -> None:
    view = HookView(tmp_path)
    other_gpu = next(g for g in FOUND.gpus if not g.mig_enabled and g.uuid != WHOLE_GPU.uuid).uuid

    async def body() -> None:
        async with running_driver(gpu_sharing="memory", library=True) as node:
            ref = node.add_claim(shared("two-gpus", WHOLE, "8Gi"))
            assert (await node.watcher.prepare(DRIVER, [ref])).claims[ref[2]].error == ""
            (hook,) = hooks(node, ref[2])
            run_spec_hook(hook, view)
            run_spec_hook(hook, view, gpu=other_gpu)  # one share ID named on another GPU
            assert cap(node, view.pod()) == cap(node, view.pod(), other_gpu) == 8 * GIB
            assert (await node.watcher.unprepare(DRIVER, [ref])).claims[ref[2]].error == ""
            assert cap(node, view.pod()) is None
            assert cap(node, view.pod(), other_gpu) is None

    run(body)


def test_unprepare_leaves_a_pod_what_another_claims_share_holds(tmp_path: Path) -> None:
    view = HookView(tmp_path)

    async def body() -> None:
        async with running_driver(gpu_sharing="memory", library=True) as node:
            first = node.add_claim(shared("first", WHOLE, "8Gi"))
            second = node.add_claim(shared("second", WHOLE, "4Gi", OTHER_SHARE))
            prepared = await node.watcher.prepare(DRIVER, [first, second])
            assert all(c.error == "" for c in prepared.claims.values())
            run_spec_hook(*hooks(node, first[2]), view)
            view.enter(POD, "c2")
            run_spec_hook(*hooks(node, second[2]), view)
            assert cap(node, view.pod()) == 12 * GIB
            assert (await node.watcher.unprepare(DRIVER, [first])).claims[first[2]].error == ""
            assert cap(node, view.pod()) == 4 * GIB
            assert cap(node, view.pod(OTHER_POD)) is None

    run(body)


CLAIM = "0b5a7c2e-1f3d-4e6a-9b8c-7d6e5f4a3b2c"
OTHER_CLAIM = "9e8d7c6b-5a49-4382-a716-f5e4d3c2b1a0"


def write_record(records: Path, claim_uid: str, cgroup: str, limit: int) -> Path:
    path = records / f"{claim_uid}_{SHARE}_0.json"
    entry = {"claim": claim_uid, "share": SHARE, "gpu": WHOLE_GPU.uuid, "nameSpace": cgroup}
    path.write_text(json.dumps({**entry, "limit": limit}))
    return path


def waiting_on(lock: Path) -> bool:
    """Whether a process waits for an flock on `lock` (/proc/locks lists a waiter with `->`)."""
    inode = f":{lock.stat().st_ino} "
    return any(
        "->" in line and inode in line for line in Path("/proc/locks").read_text().splitlines()
    )


def test_unprepare_takes_the_hooks_lock_before_it_reads_the_records(tmp_path: Path) -> None:
    write_record(tmp_path, CLAIM, "/pod", GIB)
    set_back: list[tuple[str, str, int | None]] = []
    lock = tmp_path / LOCK_FILE
    held = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(held, fcntl.LOCK_EX)  # a hook in the middle of its records
    results: list[str] = []
    unprepare = threading.Thread(
        target=lambda: results.append(
            clear_claim(tmp_path, CLAIM, lambda *args: set_back.append(args))
        )
    )
    try:
        unprepare.start()
        for _ in range(6000):  # bounded: until the Unprepare waits on the lock
            if waiting_on(lock):
                break
            time.sleep(0.01)
        assert waiting_on(lock), "Unprepare does not wait for the hooks' lock"
        assert set_back == [] and unprepare.is_alive()
    finally:
        fcntl.flock(held, fcntl.LOCK_UN)
        os.close(held)
        unprepare.join(60)
    assert results == [""]
    assert set_back == [(WHOLE_GPU.uuid, "/pod", None)]


def test_unprepare_logs_and_skips_another_claims_unreadable_record(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_record(tmp_path, CLAIM, "/pod", GIB)
    broken = tmp_path / f"{OTHER_CLAIM}_{SHARE}_0.json"
    broken.write_text('{"claim": "')  # cut short
    set_back: list[tuple[str, str, int | None]] = []
    with caplog.at_level(logging.WARNING, logger="deviceplugin.dra.memorylimits"):
        assert clear_claim(tmp_path, CLAIM, lambda *args: set_back.append(args)) == ""
    assert set_back == [(WHOLE_GPU.uuid, "/pod", None)]
    (logged,) = [r for r in caplog.records if r.getMessage() == "dra.limit_record.unreadable"]
    assert getattr(logged, FIELDS)["path"] == str(broken)
    assert broken.exists()
