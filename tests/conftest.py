"""Fixtures shared by the test modules."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from simnode import BACKENDS, use_backend


@pytest.fixture(params=BACKENDS)
def nvml_backend(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run the test once on each NVML backend SimNode has (see simnode.py)."""
    use_backend(request.param)
    yield request.param
    use_backend("python")
