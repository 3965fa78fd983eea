"""The architecture's rules, checked on the source: one module imports pynvml, the pure core
imports no I/O edge, and nothing below __main__ decides to exit."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "deviceplugin"
GENERATED = ("v1beta1", "podresources")
PURE_CORE = (
    "config",
    "config_keys",
    "devices",
    "errors",
    "resources",
    "allocation",
    "topology",
    "gpuset",
    "packing",
    "xidpolicy",
)
EDGES = {
    "pynvml",
    "grpc",
    "watchdog",
    "prometheus_client",
    "deviceplugin.nvml",
    "deviceplugin.server",
    "deviceplugin.supervisor",
    "deviceplugin.sim",
}


def modules() -> dict[str, ast.Module]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if relative.parts[0] in GENERATED:
            continue
        name = ".".join(relative.with_suffix("").parts)
        found[name] = ast.parse(path.read_text(), filename=str(path))
    return found


def imported(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_only_the_nvml_module_imports_pynvml() -> None:
    importers = sorted(
        name
        for name, tree in modules().items()
        if any(n == "pynvml" or n.startswith("pynvml.") for n in imported(tree))
    )
    assert importers == ["nvml"]


@pytest.mark.parametrize("module", PURE_CORE)
def test_pure_core_imports_no_edge(module: str) -> None:
    names = imported(modules()[module])
    edges = {n for n in names if any(n == e or n.startswith(e + ".") for e in EDGES)}
    assert not edges, f"{module} imports {sorted(edges)}"


def test_only_main_calls_sys_exit() -> None:
    callers = sorted(
        name
        for name, tree in modules().items()
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr == "exit"
        and isinstance(node.value, ast.Name)
        and node.value.id == "sys"
    )
    assert callers == ["__main__"]
