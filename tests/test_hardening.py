"""Regression tests of the hardening cases, each through the real seams: the kubelet emulators
over real sockets, the CLI as a process.

- a plugin socket replaced by a regular file before the plugin noticed it was deleted: the next
  kubelet restart must find the resource served and registered again (device plugin and DRA);
- a claim UID that walks out of the CDI directory: refused, nothing outside touched;
- a kubelet directory too long for a unix socket, a CDI spec directory that is a file: usage
  errors naming the flag, no traceback.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from deviceplugin.cli import SERVE_ENV_VARS
from deviceplugin.dra.prepare import spec_file_name
from deviceplugin.model.hostpaths import MAX_SOCKET_PATH
from deviceplugin.sim.kubelet import KubeletEmulator
from tests.draplugin import DRIVER, claim, run, running_driver, short_dir
from tests.harness import MIG, running_plugin

TRAVERSAL_UID = "x/../../adv/canary"  # from the CDI dir's k8s.<driver>-claim_x/ up to its parent


def test_a_claim_uid_that_walks_out_of_the_cdi_dir_is_refused_and_touches_nothing() -> None:
    async def body() -> None:
        async with running_driver() as node:
            (node.cdi_dir / spec_file_name(DRIVER, "x")[: -len(".json")]).mkdir(parents=True)
            canary = node.cdi_dir.parent / "adv" / "canary.json"
            canary.parent.mkdir()
            canary.write_text("{}")
            assert (node.cdi_dir / spec_file_name(DRIVER, TRAVERSAL_UID)).resolve() == canary

            hostile = ("default", "hostile", TRAVERSAL_UID)
            for version in ("v1.DRAPlugin", "v1beta1.DRAPlugin"):
                done = await node.watcher.unprepare(DRIVER, [hostile], version=version)
                assert done.claims[TRAVERSAL_UID].error == (
                    f"claims[0].uid: {TRAVERSAL_UID!r} is not a UID (a lowercase UUID such as"
                    " 3f2b6c1e-8d4a-4c2e-9b1f-0a6d2e7c5b90)"
                )
            assert canary.read_text() == "{}"

            good = node.add_claim(claim("good", [("gpu", "gpu-4")]))
            response = await node.watcher.prepare(DRIVER, [hostile, good])
            assert "claims[0].uid" in response.claims[TRAVERSAL_UID].error
            assert response.claims[good[2]].error == ""  # the others are prepared anyway
            assert canary.read_text() == "{}"
            assert sorted(p.name for p in canary.parent.iterdir()) == ["canary.json"]

    run(body)


def test_a_namespace_or_name_kubernetes_would_not_allow_is_refused_by_field() -> None:
    async def body() -> None:
        async with running_driver() as node:
            uid = "0b7e4b8e-5f0a-4c1e-9d6a-2f3c4b5a6d7e"
            refs = [("Bad_NS", "ok", uid), ("default", "../x", uid.replace("0b7e", "1b7e"))]
            response = await node.watcher.prepare(DRIVER, refs)
            errors = {u: e.error for u, e in response.claims.items()}
            assert errors[uid].startswith("claims[0].namespace: 'Bad_NS' is not a DNS label")
            assert errors[refs[1][2]].startswith("claims[1].name: '../x' is not a DNS subdomain")
            assert not list(node.cdi_dir.glob("*.json"))

    run(body)


def is_socket(path: Path) -> bool:
    return path.exists() and stat.S_ISSOCK(path.lstat().st_mode)


def registered(kubelet: KubeletEmulator, resource: str) -> int:
    return sum(1 for r in kubelet.registrations if r.resource == resource and r.ok)


def replace_with_a_file(socket: Path) -> None:
    """What the kubelet (or anyone) may leave at our path: a regular file, in one quick step."""
    socket.unlink()
    socket.write_text("not a socket")


def test_a_plugin_socket_replaced_by_a_file_is_served_and_registered_after_a_kubelet_restart() -> (
    None
):
    async def body() -> None:
        async with running_plugin() as plugin:
            socket = plugin.kubelet_dir / "nvidia-mig-1g.10gb.sock"
            before = registered(plugin.kubelet, MIG)
            replace_with_a_file(socket)
            await plugin.kubelet.restart()
            await plugin.until(
                lambda: (
                    is_socket(socket)
                    and registered(plugin.kubelet, MIG) > before
                    and plugin.kubelet.allocatable(MIG) == 28
                    and plugin.supervisor.status().ready
                ),
                timeout=10,
            )

    run(body)


def test_dra_sockets_replaced_by_files_are_served_again_and_the_driver_registers_anew() -> None:
    async def body() -> None:
        async with running_driver() as node:
            registration = node.driver.registration.socket
            replace_with_a_file(registration)
            await node.watcher.wait_deregistered(DRIVER)
            await node.driver.heal_sockets()
            assert is_socket(registration)
            await node.watcher.wait_registered(DRIVER)

            replace_with_a_file(node.driver.dra_socket)
            assert not node.driver.status().serving  # a file there is not a served socket
            await node.driver.heal_sockets()
            assert is_socket(node.driver.dra_socket) and node.driver.status().serving
            ref = node.add_claim(claim("after", [("gpu", "gpu-4")]))
            assert (await node.watcher.prepare(DRIVER, [ref])).claims[ref[2]].error == ""

    run(body)


def test_stop_leaves_a_file_that_took_the_place_of_its_socket() -> None:
    async def body() -> None:
        async with running_driver() as node:
            replace_with_a_file(node.driver.dra_socket)
            await node.driver.stop()
            assert node.driver.dra_socket.read_text() == "not a socket"
            assert not node.driver.registration.socket.exists()  # still ours: removed
            await node.restart()  # serves again over the file
            assert is_socket(node.driver.dra_socket)

    run(body)


def deviceplugin(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in SERVE_ENV_VARS}
    # Never the host's /var/run/cdi: serve removes a spec it does not want before it finds
    # a usage error that only the discovered resources show.
    env["DP_CDI_SPEC_DIR"] = tempfile.mkdtemp(prefix="dp-cdi-")
    return subprocess.run(
        [sys.executable, "-m", "deviceplugin", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


def long_dir(length: int) -> Path:
    """A directory path of exactly `length` bytes under a fresh temp dir."""
    base = short_dir("dph")
    return base / ("d" * (length - len(str(base)) - 1))


@pytest.mark.parametrize(
    ("args", "flag", "says"),
    [
        pytest.param(
            ("serve", "--kubelet-dir", str(long_dir(MAX_SOCKET_PATH))),
            "--kubelet-dir / DP_KUBELET_DIR",
            "kubelet.sock is 120 bytes long; a unix socket path holds at most 107",
            id="kubelet-dir",
        ),
        pytest.param(
            ("dra", "serve", "--kubelet-root", str(long_dir(80))),
            "--kubelet-root / DP_KUBELET_ROOT",
            "gpu.nvidia.com-reg.sock is 121 bytes long",
            id="kubelet-root",
        ),
        pytest.param(
            ("dra", "serve", "--driver-name", "GPU_nvidia.com"),
            "--driver-name / DP_DRA_DRIVER_NAME",
            "'GPU_nvidia.com' is not a DNS subdomain",
            id="driver-name",
        ),
    ],
)
def test_a_path_flag_that_cannot_work_is_a_usage_error(
    args: tuple[str, ...], flag: str, says: str
) -> None:
    done = deviceplugin(*args, "--simulate", "h100-x8")
    assert done.returncode == 2, done.stderr
    assert f"deviceplugin: error: {flag}: " in done.stderr and says in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("command", [("serve",), ("dra", "serve")])
def test_a_cdi_spec_dir_that_is_a_file_is_a_usage_error(command: tuple[str, ...]) -> None:
    file = short_dir("dph") / "cdi"
    file.write_text("")
    done = deviceplugin(*command, "--simulate", "h100-x8", "--cdi-spec-dir", str(file))
    assert done.returncode == 2, done.stderr
    assert f"--cdi-spec-dir / DP_CDI_SPEC_DIR: {file} is not a directory" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_resource_socket_too_long_for_the_kubelet_dir_is_a_start_up_error_naming_the_flag() -> (
    None
):
    directory = long_dir(MAX_SOCKET_PATH - len("/nvidia-gpu.sock") + 2)  # kubelet.sock fits
    config = directory.parent / "config.yaml"
    config.write_text("version: v1\n")
    done = deviceplugin(
        "serve",
        "--simulate",
        "h100-x8",
        "--kubelet-dir",
        str(directory),
        "--config-file",
        str(config),
    )
    assert done.returncode == 2, done.stderr
    assert "startup.invalid field=--kubelet-dir" in done.stderr
    assert "nvidia-gpu.sock is 109 bytes long" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_cdi_dir_that_became_a_file_fails_the_claim_with_enotdir_naming_it() -> None:
    async def body() -> None:
        async with running_driver() as node:
            node.cdi_dir.write_text("")
            ref = node.add_claim(claim("blocked", [("gpu", "gpu-4")]))
            error = (await node.watcher.prepare(DRIVER, [ref])).claims[ref[2]].error
            assert error.endswith(f"ENOTDIR {node.cdi_dir} is not a directory"), error

    run(body)
