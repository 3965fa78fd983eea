"""A command whose optional dependency is not installed exits 2 naming the extra that brings it,
never with a traceback: `dra demo` from `pip install '.[dra]'` lacks the API-server stand-in's
(`sim`) modules."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from deviceplugin.program import EXTRAS

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def run_without(module: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """`deviceplugin ARGV` in a fresh interpreter where importing `module` fails as it does when
    its distribution is not installed (None in sys.modules: ModuleNotFoundError)."""
    code = (
        "import sys\n"
        f"sys.modules[{module!r}] = None\n"
        "from deviceplugin.__main__ import main\n"
        f"raise SystemExit(main({list(argv)!r}))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.parametrize("module", ["kubernetes_validate", "aiohttp"])
def test_dra_demo_without_the_sim_extra_names_it(module: str) -> None:
    result = run_without(module, "dra", "demo")
    assert result.returncode == 2, result.stderr
    assert "startup.missing_dependency" in result.stderr
    assert f"module={module}" in result.stderr
    assert "pip install 'deviceplugin[sim]'" in result.stderr
    assert "Traceback" not in result.stderr


def test_every_extra_named_is_one_pyproject_defines() -> None:
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    assert {extra for extra in EXTRAS.values() if extra not in extras} == set()


def test_the_sim_extra_brings_the_stand_ins_modules_and_dev_includes_it() -> None:
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    distributions = {requirement.split(">")[0].split("=")[0] for requirement in extras["sim"]}
    modules = {name.replace("-", "_") for name in distributions}
    assert modules == {module for module, extra in EXTRAS.items() if extra == "sim"}
    assert any(r.startswith("deviceplugin[") and "sim" in r for r in extras["dev"])
