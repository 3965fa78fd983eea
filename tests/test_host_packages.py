"""The host packages the root targets need: one list (e2e/host-packages.txt), in step with what
build.sh checks and what the cluster's `cluster` command (node.py and its modules) runs, so the
next missing package fails here and not on a new machine after a 10-minute build."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from e2e.cluster import node

REPO = Path(__file__).resolve().parent.parent
LIST = REPO / "e2e" / "host-packages.txt"
INSTALLER = REPO / "e2e" / "host-packages.sh"
BUILD = REPO / "e2e" / "cluster" / "build.sh"
# What build.sh runs for the version asked for: the checks and the steps.
RECIPE = REPO / "e2e" / "cluster" / "build-module.sh"
GROUPS = {"build", "node", "images", "fuzz"}
# What every new machine has before anything is installed.
GIVEN_COMMANDS = {"make", "python3", "go", "gcc"}


def listed() -> dict[str, tuple[str, str]]:
    """package -> (group, reason), from the list's non-comment lines."""
    rows: dict[str, tuple[str, str]] = {}
    for line in LIST.read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        package, group, reason = line.split(maxsplit=2)
        rows[package] = (group, reason)
    return rows


def group(name: str) -> set[str]:
    return {package for package, (g, _) in listed().items() if g == name}


def test_every_listed_package_has_a_known_group_and_a_reason() -> None:
    rows = listed()
    assert rows, "the list is empty"
    for package, (group_name, reason) in rows.items():
        assert group_name in GROUPS, f"{package}: unknown group {group_name}"
        assert len(reason.split()) >= 3, f"{package}: say why it is needed"


def test_build_sh_checks_exactly_the_build_group() -> None:
    checked = set(re.findall(r"^\s*need \S+ \S+ (\S+)$", RECIPE.read_text(), re.MULTILINE))
    assert checked == group("build")


def test_build_sh_checks_what_its_steps_use() -> None:
    """cgo and the static pause binary need the compiler and libc; the seccomp tag, libseccomp."""
    script = RECIPE.read_text()
    needs = set(re.findall(r"^\s*need \S+ (\S+) \S+$", script, re.MULTILINE))
    assert "CGO_ENABLED=1" in script and re.search(r'-tags "[^"]*\bseccomp\b', script), (
        "the patterns no longer find build.sh's cgo and seccomp steps"
    )
    if "CGO_ENABLED=1" in script or re.search(r"^\s*step .* gcc ", script, re.MULTILINE):
        assert {"gcc", "libc.a"} <= needs
    if re.search(r'-tags "[^"]*\bseccomp\b', script):
        assert {"pkg-config", "libseccomp"} <= needs


def test_node_py_commands_are_the_node_group() -> None:
    assert set(node.HOST_COMMANDS.values()) == group("node")


def test_node_py_runs_no_host_command_it_does_not_declare() -> None:
    """Every module of `cluster` beside node.py counts (pki runs openssl, network ip and
    iptables); the scenarios (test_*.py) run none."""
    tooling = [p for p in Path(node.__file__).parent.glob("*.py") if not p.name.startswith("test_")]
    source = "".join(path.read_text() for path in tooling)
    commands = set(re.findall(r'run\(\s*\[\s*"([\w.-]+)"', source))
    assert {"ip", "iptables", "umount"} <= commands, "the pattern no longer finds the commands"
    assert commands - GIVEN_COMMANDS <= set(node.HOST_COMMANDS)


def test_up_asks_for_every_group() -> None:
    assert set(node.PACKAGE_GROUPS) == GROUPS - {"fuzz"}  # fuzz: the test suite's, not the node's


def test_setup_host_installs_through_the_list() -> None:
    setup = (REPO / "e2e" / "setup-host.sh").read_text()
    assert 'host-packages.sh" images' in setup
    assert "apt-get install" not in setup, "install through e2e/host-packages.sh, from the list"


def fake_tree(tmp_path: Path, lines: str) -> Path:
    """A copy of the installer beside a list of our own."""
    (tmp_path / "host-packages.txt").write_text(lines)
    shutil.copy(INSTALLER, tmp_path / "host-packages.sh")
    return tmp_path / "host-packages.sh"


def test_a_missing_package_is_named_in_one_line_with_its_install_command(tmp_path: Path) -> None:
    script = fake_tree(
        tmp_path,
        "bash  build  the shell every script runs in\n"
        "deviceplugin-no-such-package  build  stands for a package this host lacks\n",
    )
    done = subprocess.run([script, "--check", "build"], capture_output=True, text=True)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "deviceplugin-no-such-package" in lines[0]
    assert "apt-get install" in lines[0] and " bash" not in lines[0].split("missing")[1]


def test_nothing_missing_is_silent(tmp_path: Path) -> None:
    script = fake_tree(tmp_path, "bash  build  the shell every script runs in\n")
    done = subprocess.run([script, "--check", "build"], capture_output=True, text=True)
    assert (done.returncode, done.stderr) == (0, "")


def test_an_unknown_group_is_a_usage_error() -> None:
    done = subprocess.run([INSTALLER, "--check", "gpus"], capture_output=True, text=True)
    assert done.returncode == 2
    assert "no group 'gpus'" in done.stderr


def path_without(tmp_path: Path, absent: set[str], stubs: dict[str, str]) -> dict[str, str]:
    """An environment whose PATH has the tools build.sh's check uses, less `absent`, with
    `stubs` (name -> shell body) in their place."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tools = {"bash", "cat", "cut", "dirname", "go", "gcc", "head", "pkg-config", "sed", "sha256sum"}
    tools |= {"sort"}
    for tool in tools - absent - set(stubs):
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    for name, body in stubs.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    return {**os.environ, "PATH": str(bin_dir), "E2E_CLUSTER_CACHE": str(tmp_path / "cache")}


@pytest.mark.parametrize(
    ("absent", "stubs", "named"),
    [
        ({"gcc"}, {}, "gcc (command; Debian package gcc)"),
        (
            set(),
            {"gcc": 'echo "${1#-print-file-name=}"'},
            "libc.a (gcc-file; Debian package libc6-dev)",
        ),
        ({"pkg-config"}, {}, "pkg-config (command; Debian package pkg-config)"),
        (set(), {"pkg-config": "exit 1"}, "libseccomp (pkg-config; Debian package libseccomp-dev)"),
    ],
)
def test_build_sh_names_a_missing_prerequisite_at_once(
    tmp_path: Path, absent: set[str], stubs: dict[str, str], named: str
) -> None:
    done = subprocess.run(
        [BUILD], capture_output=True, text=True, env=path_without(tmp_path, absent, stubs)
    )
    assert done.returncode == 1
    assert named in done.stderr
    assert "nothing built" in done.stderr
    assert not (tmp_path / "cache").exists(), "it started building"
