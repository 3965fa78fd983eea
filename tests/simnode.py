"""Small simulated nodes for tests: write a node file, open NVML on it, append events.

Two backends stand behind `SimNode` (the `nvml_backend` fixture of conftest.py picks one):
"python", the simulator object in place of the pynvml module, and "c", the real pynvml bound
to the simulated libnvidia-ml.so.1 that `sim-root` installs, reached through the production
path (`real_nvml(driver_root)`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from deviceplugin.node.nvml import Nvml, real_nvml
from deviceplugin.sim.fake_nvml import FakeNvml
from deviceplugin.sim.hostroot import EVENTS_FILE, install_library
from deviceplugin.sim.libbuild import library_path
from deviceplugin.sim.node import read_node

BACKENDS = ("python", "c")
_backend = {"name": "python"}


def use_backend(name: str) -> None:
    """Make the next SimNodes use this backend."""
    _backend["name"] = name


def python_only(why: str) -> None:
    """Skip the running test on the C backend."""
    if _backend["name"] != "python":
        pytest.skip(f"python backend only: {why}")


def gpu_uuid(index: int) -> str:
    return f"GPU-{index:08x}-0000-4000-8000-000000000000"


def mig_uuid(gpu: int, mig: int) -> str:
    return f"MIG-{gpu:08x}-{mig:04x}-4000-8000-000000000000"


def gpu(position: int, /, **fields: Any) -> dict[str, Any]:
    """One GPU entry: an A100-SXM4-80GB at bus 0x10+position unless `fields` say otherwise."""
    entry: dict[str, Any] = {
        "uuid": gpu_uuid(position),
        "name": "NVIDIA A100-SXM4-80GB",
        "memoryMiB": 81920,
        "pciBusId": f"00000000:{0x10 + position:02X}:00.0",
    }
    entry.update(fields)
    return entry


def migs(gpu_index: int, *profiles: str, **fields: Any) -> dict[str, Any]:
    """GPU fields for a MIG-enabled GPU holding one MIG device per profile."""
    devices = [
        {"profile": profile, "uuid": mig_uuid(gpu_index, n), "gpuInstanceId": n + 1}
        for n, profile in enumerate(profiles)
    ]
    return {"migCapable": True, "migEnabled": True, "migDevices": devices, **fields}


def write_node(path: Path, gpus: list[dict[str, Any]]) -> Path:
    path.write_text(yaml.safe_dump({"gpus": gpus}))
    return path


class SimNode:
    """A node file, the simulator on it, an events file, and Nvml over the simulator."""

    def __init__(self, tmp_path: Path, gpus: list[dict[str, Any]], numa: bool = True) -> None:
        self.node_path = write_node(tmp_path / "node.yaml", gpus)
        self.backend = _backend["name"]
        self.sim: Any
        if self.backend == "c":
            root = tmp_path / "root"
            install_library(read_node(self.node_path), root, library_path())
            self.events_path = root / EVENTS_FILE
            self.nvml = real_nvml(str(root))
            self.sim = self.nvml.module
        else:
            self.events_path = tmp_path / "events.jsonl"
            self.sim = FakeNvml(str(self.node_path), str(self.events_path))
            self.nvml = Nvml(self.sim, numa_reader=self.sim.numa_node if numa else None)
        self.nvml.init()

    def append(self, *lines: dict[str, Any] | str) -> None:
        with open(self.events_path, "a") as stream:
            for line in lines:
                stream.write((line if isinstance(line, str) else json.dumps(line)) + "\n")

    def rewrite(self, gpus: list[dict[str, Any]]) -> None:
        python_only("the C library reads its node once, at its first nvmlInit")
        write_node(self.node_path, gpus)
