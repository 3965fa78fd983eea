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
