"""`deviceplugin validate-config FILE` as a process: FILE may be a pipe, as in
`kubectl exec -i ... validate-config /dev/stdin < config.yaml`, but never more than a ConfigMap
holds; every refusal exits 2 naming the file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

DEVICEPLUGIN = str(Path(sys.executable).with_name("deviceplugin"))


def validate(path: str, stdin: bytes = b"") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DEVICEPLUGIN, "validate-config", path],
        input=stdin.decode(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_config_on_a_pipe_is_validated() -> None:
    done = validate("/dev/stdin", b"version: v1\nflags: {migStrategy: mixed}\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        "/dev/stdin: valid v1 config: migStrategy=mixed, deviceListStrategy=envvar, no sharing\n"
    )


@pytest.mark.parametrize(
    ("path", "stdin", "message"),
    [
        pytest.param(
            "/dev/stdin",
            b"",
            "invalid: /dev/stdin: the config is empty; a file that says 'version: v1' gives "
            "the defaults\n",
            id="empty-pipe",
        ),
        pytest.param(
            "/dev/zero",
            b"",
            "invalid: /dev/zero: config file holds more than 1048576 bytes; the limit is "
            "1048576 bytes (1 MiB, the most a ConfigMap holds)\n",
            id="endless",
        ),
        pytest.param(
            "/", b"", "invalid: /: cannot read config file: Is a directory\n", id="directory"
        ),
    ],
)
def test_what_cannot_be_a_config_exits_2(path: str, stdin: bytes, message: str) -> None:
    done = validate(path, stdin)
    assert (done.returncode, done.stderr, done.stdout) == (2, message, "")


MPS = "sharing: {mps: {resources: [{name: gpu, replicas: 4}]}}"
SOCKET_UNDER_ROOT = "/nvidia.com/gpu/pipe/control"  # the daemon's control socket, under mpsRoot
FITS = "/run/" + "m" * (107 - len(SOCKET_UNDER_ROOT) - len("/run/"))  # socket: 107 bytes
OUTSIDE = "not / or under /dev, /proc, /sys"
UNCLEAN = "a clean absolute path"


def validate_mps_root(root: str) -> subprocess.CompletedProcess[str]:
    return validate("/dev/stdin", f"version: v1\nflags: {{mpsRoot: '{root}'}}\n{MPS}\n".encode())


@pytest.mark.parametrize(
    ("root", "reason"),
    [
        pytest.param("/dev", OUTSIDE, id="dev"),
        pytest.param("/dev/shm", OUTSIDE, id="dev-shm"),
        pytest.param("/proc/self/root", OUTSIDE, id="proc"),
        pytest.param("/sys", OUTSIDE, id="sys"),
        pytest.param("/", OUTSIDE, id="root"),
        pytest.param("/run/../dev", UNCLEAN, id="dot-dot"),
        pytest.param("/run/./mps", UNCLEAN, id="dot"),
        pytest.param("/run//mps", UNCLEAN, id="doubled-slash"),
        pytest.param("//run/mps", UNCLEAN, id="leading-double-slash"),
        pytest.param("/run/mps/", UNCLEAN, id="trailing-slash"),
        pytest.param(
            FITS + "m",
            "too long for the MPS control socket of sharing.mps.resources[0] (nvidia.com/gpu):"
            f" {FITS}m{SOCKET_UNDER_ROOT} is 108 bytes long; a unix socket path holds at most 107",
            id="socket-one-byte-too-long",
        ),
    ],
)
def test_an_mps_root_that_is_not_a_clean_directory_of_its_own_exits_2(
    root: str, reason: str
) -> None:
    done = validate_mps_root(root)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith("invalid: /dev/stdin: flags.mpsRoot: "), done.stderr
    assert reason in done.stderr
    assert root in done.stderr


def test_a_clean_mps_root_whose_socket_just_fits_is_valid() -> None:
    done = validate_mps_root(FITS)
    assert done.returncode == 0, done.stderr
    assert "MPS" in done.stdout or "mps" in done.stdout, done.stdout
