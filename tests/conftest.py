"""Fixtures shared by the test modules."""

from __future__ import annotations

from collections.abc import Iterator

import pynvml
import pytest
from simnode import BACKENDS, use_backend


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
