"""Fixtures shared by the test modules."""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pynvml
import pytest
from simnode import BACKENDS, use_backend

from deviceplugin.ops.logs import JsonFormatter, TextFormatter

# The suites `make test`, `make test-slow` and `make fuzz` run (`--suite`; tests/suites.py).
pytest_plugins = ("suites",)


@pytest.fixture(autouse=True, scope="session")
def cdi_specs_off_the_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """No `serve` a test starts uses the host's /var/run/cdi: serve removes a spec it does not
    want, and the host's may be a real plugin's (a GPU node, or the real-cluster tests). Tests
    pass their own folder; this covers any child process that inherits the environment."""
    os.environ["DP_CDI_SPEC_DIR"] = str(tmp_path_factory.mktemp("cdi"))
    yield
    del os.environ["DP_CDI_SPEC_DIR"]


@pytest.fixture(autouse=True)
def no_log_handler_outlives_its_test() -> Iterator[None]:
    """A test that runs `main()` leaves the root logger writing to that test's captured stderr,
    which pytest closes: a thread that logs later (a health monitor still starting) would fail
    to write and print logging's traceback among other tests' output. Remove that handler."""
    yield
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler.formatter, (TextFormatter, JsonFormatter)):
            root.removeHandler(handler)


@pytest.fixture(scope="session")
def fresh_sim_root(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, Path], Path]:
    """`fresh_sim_root(node, directory)`: the tree `deviceplugin sim-root node directory`
    writes, copied (`cp -a`: links and device nodes as they are) from one that command wrote
    once per node and session. A test that changes its node's state gets a clean one for the
    cost of a copy, not of a process that imports the package."""
    from test_sim_library import sim_root

    written: dict[str, Path] = {}

    def fresh(node: str, directory: Path) -> Path:
        if node not in written:
            written[node] = sim_root(node, tmp_path_factory.mktemp("sim-root") / "root")
        subprocess.run(["cp", "-a", str(written[node]), str(directory)], check=True)
        return directory

    return fresh


@pytest.fixture(params=BACKENDS)
def nvml_backend(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run the test once on each NVML backend SimNode has (see simnode.py)."""
    use_backend(request.param)
    yield request.param
    use_backend("python")


@pytest.fixture
def no_nvml_library(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host without a driver: pynvml finds no libnvidia-ml.so.1, whatever this process has
    loaded before (a simulated library answers a load by soname once it is in the process)."""

    def missing(name: str, *_args: object, **_kwargs: object) -> None:
        raise OSError(f"{name}: cannot open shared object file: No such file or directory")

    monkeypatch.setattr(pynvml, "nvmlLib", None)
    monkeypatch.setattr(pynvml, "CDLL", missing)
    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer_cache", {})
