"""The pure parts of `make bench-reference` (bench/reference.py): the table's ratios, a reference
cut at its time limit, and finding the plugin's own process under the wrapper that starts it."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from bench.reference import OURS, REFERENCE, Row, from_samples, table
from testbed.plugins import running

# What /proc/<pid>/exe names for `sleep` (a multi-call binary on some systems).
SLEEP = Path(shutil.which("sleep") or "/bin/sleep").resolve().name


def test_a_row_shows_both_values_and_ours_over_the_reference() -> None:
    assert Row("Allocate p50", "ms", 0.5, 0.25).cells() == ("0.500 ms", "0.250 ms", "2.000x")
    assert Row("kubelet restart", "ms", 30.0, 450.0).cells() == ("30.0 ms", "450 ms", "0.067x")


def test_no_ratio_over_a_reference_of_zero() -> None:
    assert Row("CPU idle", "CPU s", 0.02, 0.0).cells() == ("0.020 CPU s", "0.000 CPU s", "—")


def test_a_reference_over_its_limit_is_a_bound_and_so_is_the_ratio() -> None:
    row = from_samples("preferred", "ms", {OURS: [3.0, 2.0, 4.0], REFERENCE: []}, 60_000.0)
    assert row.ours == 3.0
    assert row.cells() == ("3.000 ms", "> 60000 ms", "< 0.000x")


def test_the_table_is_markdown_with_one_line_per_row_and_errors_inline() -> None:
    rows = [Row("start", "s", 0.3, 0.6), Row("large", "", None, None, error="BenchError: x\ny")]
    lines = table(rows).splitlines()
    assert lines[0] == "| measure | ours | reference v0.19.0 | ours ÷ reference |"
    assert lines[2] == "| start | 0.300 s | 0.600 s | 0.500x |"
    assert lines[3] == "| large | error: BenchError: x |  |  |"


def _wait_for_sleep_under(pid: int) -> None:
    """Until a child of `pid` has exec'd `sleep`: a forked child runs the shell until then."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        for children in Path(f"/proc/{pid}/task").glob("*/children"):
            for child in children.read_text().split():
                with contextlib.suppress(OSError):
                    if Path(f"/proc/{child}/exe").resolve().name == SLEEP:
                        return
        time.sleep(0.01)


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
def test_the_plugin_process_is_found_under_a_shell_that_forks_it() -> None:
    shell = subprocess.Popen(["sh", "-c", "sleep 30; true"])
    try:
        _wait_for_sleep_under(shell.pid)
        found = running(shell.pid, SLEEP)
        assert found != shell.pid
        assert Path(f"/proc/{found}/cmdline").read_bytes().startswith(b"sleep\0")
        with pytest.raises(LookupError):
            running(shell.pid, "no-such-program")
    finally:
        shell.kill()
        shell.wait()


def test_a_process_that_has_exec_d_the_program_is_itself() -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        deadline = time.monotonic() + 5
        while Path(f"/proc/{child.pid}/exe").resolve().name != SLEEP:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert running(child.pid, SLEEP) == child.pid
    finally:
        child.kill()
        child.wait()
