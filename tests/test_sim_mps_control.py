"""The simulated `nvidia-cuda-mps-control` that `sim-root` installs, run as its consumers run it:
`-d` to start the control daemon, then one client process per batch of commands on stdin. It
must serve the pipe directory it is given, keep the limits it is told, record them where a test
and the simulated NVML read them, refuse bad values, and say when no daemon runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_sim_library import sim_root

from deviceplugin.sim.hostroot import MPS_CONTROL

LIMITS = "deviceplugin-sim-mps.json"


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = sim_root("a100-80gb-x8-mixed", tmp_path_factory.mktemp("mpsroot"))
    return root / MPS_CONTROL


class Control:
    """One pipe and log directory (short: the socket path must fit AF_UNIX) and the program."""

    def __init__(self, program: Path, base: Path) -> None:
        self.program = program
        self.pipe = base / "pipe"
        self.log = base / "log"
        # Nothing of ours in the environment: the program needs no Python and no PATH.
        self.env = {
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe),
            "CUDA_MPS_LOG_DIRECTORY": str(self.log),
        }

    def run(self, *arguments: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.program), *arguments],
            input=stdin,
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )

    def start(self) -> None:
        done = self.run("-d")
        assert done.returncode == 0, done.stderr

    def limits(self) -> dict[str, object]:
        return json.loads((self.pipe / LIMITS).read_text())  # type: ignore[no-any-return]

    def log_text(self) -> str:
        return (self.log / "control.log").read_text()


@pytest.fixture
def control(program: Path) -> Iterator[Control]:
    with tempfile.TemporaryDirectory(prefix="mps-") as base:
        made = Control(program, Path(base))
        yield made
        if (made.pipe / LIMITS).exists():  # a daemon a test left running
            os.kill(int(made.limits()["pid"]), signal.SIGKILL)  # type: ignore[call-overload]


def test_without_a_daemon_the_client_says_so_and_fails(control: Control) -> None:
    done = control.run(stdin="get_default_active_thread_percentage\n")
    assert done.returncode == 1
    assert "Cannot find MPS control daemon process" in done.stderr


def test_the_daemon_keeps_and_records_the_limits_it_is_told(control: Control) -> None:
    control.start()
    assert (control.pipe / "control").is_socket()
    assert "Starting control daemon using socket" in control.log_text()
    assert control.run(stdin="get_default_active_thread_percentage").stdout == "100.0\n"
    # NVIDIA's device plugin writes each command without a newline, then closes stdin.
    done = control.run(stdin="set_default_device_pinned_mem_limit 0 20480M")
    assert (done.returncode, done.stdout) == (0, "")
    done = control.run(
        stdin="set_default_active_thread_percentage 25\n"
        "set_default_device_pinned_mem_limit GPU-00000004-0000-4000-8000-000000000000 10G\n"
        "get_default_active_thread_percentage\n"
        "get_default_device_pinned_mem_limit 0\n"
        "get_default_device_pinned_mem_limit 1\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["25.0", "25.0", "20480M", "none"]
    limits = control.limits()
    assert limits["activeThreadPercentage"] == 25.0
    assert limits["pinnedDeviceMemoryLimitMiB"] == {
        "0": 20480,
        "GPU-00000004-0000-4000-8000-000000000000": 10240,
    }
    assert "Cmd:set_default_active_thread_percentage 25" in control.log_text()


def test_quit_stops_the_daemon_and_a_new_one_may_start_at_once(control: Control) -> None:
    control.start()
    pid = int(control.limits()["pid"])  # type: ignore[call-overload]
    assert (control.pipe / "nvidia-cuda-mps-control.pid").read_text() == f"{pid}\n"
    assert control.run(stdin="quit\n").returncode == 0
    assert not (control.pipe / LIMITS).exists()
    assert not (control.pipe / "nvidia-cuda-mps-control.pid").exists()
    assert not (control.pipe / "control").exists()
    assert control.run(stdin="get_default_active_thread_percentage").returncode == 1
    control.start()
    assert int(control.limits()["pid"]) != pid  # type: ignore[call-overload]
    assert control.limits()["activeThreadPercentage"] == 100.0  # a new daemon starts afresh


def test_a_second_daemon_on_the_same_pipe_directory_is_refused(control: Control) -> None:
    control.start()
    done = control.run("-d")
    assert done.returncode == 1
    assert "already running" in done.stderr


def test_a_killed_daemon_leaves_no_daemon_and_can_be_started_again(control: Control) -> None:
    control.start()
    os.kill(int(control.limits()["pid"]), signal.SIGKILL)  # type: ignore[call-overload]
    # The killed process may take a moment to go: until then it still answers; after, it never
    # does. Either way a client then fails, and a new daemon starts on the stale socket.
    (control.pipe / LIMITS).unlink()
    while control.run(stdin="get_default_active_thread_percentage").returncode == 0:
        pass
    control.start()
    assert control.run(stdin="get_default_active_thread_percentage").stdout == "100.0\n"


@pytest.mark.parametrize(
    ("command", "words"),
    [
        pytest.param("set_default_active_thread_percentage 0", "percentage 0", id="zero-percent"),
        pytest.param("set_default_active_thread_percentage 101", "(0, 100]", id="over-100"),
        pytest.param("set_default_active_thread_percentage half", "percentage half", id="nan"),
        pytest.param("set_default_active_thread_percentage", "Usage", id="no-percentage"),
        pytest.param("set_default_device_pinned_mem_limit 0 10K", "limit 10K", id="unit-K"),
        pytest.param("set_default_device_pinned_mem_limit 0 10", "limit 10", id="no-unit"),
        pytest.param("set_default_device_pinned_mem_limit 0 0M", "limit 0M", id="zero"),
        pytest.param("set_default_device_pinned_mem_limit 0 -1G", "limit -1G", id="negative"),
        pytest.param("set_default_device_pinned_mem_limit gpu0 1G", "device gpu0", id="bad-dev"),
        pytest.param("set_default_device_pinned_mem_limit 0", "Usage", id="no-limit"),
        pytest.param("get_default_device_pinned_mem_limit", "Usage", id="get-no-dev"),
        pytest.param("start_the_engines", "Unknown command", id="unknown"),
    ],
)
def test_bad_values_are_refused_and_change_nothing(
    control: Control, command: str, words: str
) -> None:
    control.start()
    before = control.limits()
    done = control.run(stdin=command + "\n")
    assert done.returncode == 1
    assert words in done.stderr
    assert control.limits() == before


def test_a_refused_command_does_not_stop_the_ones_after_it(control: Control) -> None:
    control.start()
    done = control.run(
        stdin="set_default_active_thread_percentage 500\nset_default_active_thread_percentage 50\n"
    )
    assert done.returncode == 1
    assert done.stdout == "50.0\n"
    assert control.limits()["activeThreadPercentage"] == 50.0


def test_bad_usage(control: Control) -> None:
    done = control.run("--start")
    assert done.returncode == 1
    assert "Usage: nvidia-cuda-mps-control [-d | -f]" in done.stderr


def host_file(base: Path) -> Path:
    """A file of the host's, outside the pipe directory, that no daemon may touch."""
    target = base / "host-file"
    target.write_text("the host's\n")
    target.chmod(0o600)
    return target


def test_links_planted_in_the_pipe_directory_are_replaced_not_followed(control: Control) -> None:
    # Clients share the pipe directory and the daemon runs as root: a link planted where it
    # writes its pid and limits must not let it write the host's files.
    target = host_file(control.pipe.parent)
    control.pipe.mkdir()
    pid = control.pipe / "nvidia-cuda-mps-control.pid"
    for name in (pid.name, LIMITS):
        (control.pipe / name).symlink_to(target)
    control.start()
    assert control.run(stdin="set_default_active_thread_percentage 40").returncode == 0
    assert not pid.is_symlink() and int(pid.read_text()) == control.limits()["pid"]
    assert control.limits()["activeThreadPercentage"] == 40.0
    assert (target.read_text(), target.stat().st_mode & 0o777) == ("the host's\n", 0o600)
    assert (control.pipe / "control").stat().st_mode & 0o777 == 0o666  # any client connects
    assert control.run(stdin="quit").returncode == 0
    assert target.read_text() == "the host's\n"


@pytest.mark.parametrize(
    ("directory", "name"),
    [pytest.param("pipe", "control_lock", id="lock"), pytest.param("log", "control.log", id="log")],
)
def test_a_link_where_the_daemon_opens_its_lock_or_log_stops_it_and_creates_nothing(
    control: Control, directory: str, name: str
) -> None:
    missing = control.pipe.parent / "not-there"  # through the link, O_CREAT would make it
    for made in (control.pipe, control.log):
        made.mkdir()
    (control.pipe.parent / directory / name).symlink_to(missing)
    done = control.run("-d")
    assert done.returncode == 1
    assert f"cannot open {control.pipe.parent / directory / name}" in done.stderr
    assert not missing.exists()
