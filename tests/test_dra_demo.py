"""`deviceplugin dra demo` tells the whole story and ends with a clean stop."""

from __future__ import annotations

import asyncio
import shutil

import pytest

from deviceplugin.cli import SERVE_ENV_VARS
from deviceplugin.demos.dra import demo
from tests.draplugin import short_dir


def test_the_demo_registers_prepares_flips_health_and_stops(
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = short_dir("drademo")
    try:
        assert asyncio.run(demo(root, SERVE_ENV_VARS)) == 0
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out = capsys.readouterr().out
    assert "the kubelet chose v1.DRAPlugin" in out
    assert "4 GPUs and 28 MIG devices in all" in out
    assert "CDI device k8s.gpu.nvidia.com/claim=" in out
    assert "healthy=false, taint gpu.nvidia.com/unhealthy=xid-94" in out
    assert "CDI specs left: 0" in out
    assert "SIGTERM: exit 0, sockets removed: True" in out
