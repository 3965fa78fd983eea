"""A driver root is a simulated host only when `sim-root` marked it so, never by its files: a
real driver root (a GPU operator's) can carry `proc/driver/nvidia-caps/mig-minors` too, and
reading the host's files from it instead of /proc would hand containers the wrong nodes."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from draplugin import library_tree
from harness import GPU, run, running_plugin

from deviceplugin.model.config import ParsedConfig, load_config_text
from deviceplugin.model.hostpaths import MIG_MINORS, SIM_ROOT, SIM_ROOT_MARKER
from deviceplugin.node.simmarker import MAX_MARKER_BYTES, is_sim_root
from deviceplugin.runtime.host import Overrides, open_host_config
from deviceplugin.sim.hostroot import lay_out
from deviceplugin.sim.node import read_node, resolve_node_path
from deviceplugin.sim.simulator import NodeSimulator

PRESET = "a100-80gb-x8-mixed"


def parse(overrides: Overrides) -> ParsedConfig:
    return load_config_text(None, None, overrides, {})


def real_driver_root(root: Path) -> Path:
    """What a driver container's root holds: the kernel module's files under its own `proc/`,
    device nodes, the driver's libraries; no marker."""
    (root / "proc" / MIG_MINORS).parent.mkdir(parents=True)
    (root / "proc" / MIG_MINORS).write_text("config 1\nmonitor 2\ngpu0/gi1/access 12\n")
    (root / "proc/devices").write_text("Character devices:\n195 nvidia-frontend\n")
    (root / "dev").mkdir()
    (root / "dev/nvidia0").touch()
    (root / "usr/lib/x86_64-linux-gnu").mkdir(parents=True)
    (root / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1").touch()
    return root


def test_a_real_driver_roots_shape_is_not_a_simulated_host(tmp_path: Path) -> None:
    root = real_driver_root(tmp_path / "driver")
    parsed, host, _ = open_host_config(None, {"nvidia_driver_root": str(root)}, parse)
    assert host is None
    assert parsed.config.flags.nvidia_driver_root == str(root)
    assert not is_sim_root(str(root))


def test_a_laid_out_tree_is_a_simulated_host(tmp_path: Path) -> None:
    root = tmp_path / "sim"
    lay_out(read_node(resolve_node_path(PRESET)), root, every_instance=False)
    _, host, _ = open_host_config(None, {"nvidia_driver_root": str(root)}, parse)
    assert host is not None and host.root == str(root) and not host.temporary
    assert host.proc_root == str(root / "proc")
    marker = json.loads((root / SIM_ROOT_MARKER).read_text())
    assert marker["kind"] == SIM_ROOT and marker["writer"] == "deviceplugin sim-root"


def test_the_root_itself_is_never_a_simulated_host(tmp_path: Path) -> None:
    _, host, _ = open_host_config(None, {}, parse)
    assert host is None


def test_with_a_simulator_an_unmarked_tree_with_proc_is_the_simulated_host(
    tmp_path: Path,
) -> None:
    """`--simulate` says the node is simulated: a driver root given with it stands for it."""
    root = real_driver_root(tmp_path / "driver")
    _, host, _ = open_host_config(NodeSimulator(PRESET), {"nvidia_driver_root": str(root)}, parse)
    assert host is not None and host.root == str(root)
    host.close()


def _write(marker: Path, content: bytes) -> None:
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_bytes(content)


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda m: _write(m, b'{"kind": "something-else"}'), id="another-kind"),
        pytest.param(lambda m: _write(m, b'["deviceplugin-sim-root"]'), id="not-an-object"),
        pytest.param(lambda m: _write(m, b"kind: deviceplugin-sim-root\n"), id="not-json"),
        pytest.param(lambda m: _write(m, b"\xff\xfe"), id="not-utf8"),
        pytest.param(
            lambda m: _write(
                m, json.dumps({"kind": SIM_ROOT, "pad": "x" * MAX_MARKER_BYTES}).encode()
            ),
            id="too-big",
        ),
        pytest.param(lambda m: m.mkdir(parents=True), id="a-directory"),
        pytest.param(lambda m: (m.parent.mkdir(parents=True), os.mkfifo(m)), id="a-fifo"),
    ],
)
def test_a_marker_that_does_not_say_so_is_not_one(
    tmp_path: Path, make: Callable[[Path], object]
) -> None:
    root = real_driver_root(tmp_path / "driver")
    marker = root / SIM_ROOT_MARKER
    make(marker)
    assert not is_sim_root(str(root))
    if marker.is_dir():
        marker.rmdir()
    else:
        marker.unlink()
    _write(marker, json.dumps({"kind": SIM_ROOT}).encode())
    assert is_sim_root(str(root))  # the same tree, marked


def test_serve_on_a_sim_root_reads_its_host_files_only_while_it_is_marked() -> None:
    """`serve --nvidia-driver-root` on a `sim-root` tree (the simulated libnvidia-ml.so.1): its
    `proc/` stands for the host's while the marker says so; without it the tree is taken for a
    real driver's and the real /proc is read, whatever files it holds."""
    marked = library_tree(PRESET)
    unmarked = library_tree(PRESET)
    (unmarked / SIM_ROOT_MARKER).unlink()
    assert (unmarked / "proc" / MIG_MINORS).is_file()

    async def body(root: Path) -> str | None:
        async with running_plugin(driver_root=root) as plugin:
            assert plugin.kubelet.allocatable(GPU) > 0
            host = plugin.supervisor.engine.host
            return None if host is None else host.root

    assert run(body(marked)) == str(marked)
    assert run(body(unmarked)) is None
