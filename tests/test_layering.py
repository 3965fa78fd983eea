"""The architecture's rules, checked on the source (docs/architecture.md draws them). A module's
layer is the directory it sits in, with no exceptions:

- `model` imports nothing of the package and does no I/O (every file under model/ is checked);
- `node` imports `model` only;
- a front-end (`kubelet`, `ops`) imports `model` and `node`, never another front-end;
- `runtime`, what both daemons share (the engine), imports `model`, `node`, `ops` and `sim`;
- the two daemons, `plugin` and `dra`, sit side by side over `runtime`: neither imports the
  other, nor `explain`;
- `explain` (`dra explain` and its API and scheduler emulation) imports no daemon;
- `sim` imports `model` and `node`;
- `wire`, the generated gRPC stubs of the kubelet APIs, imports nothing else of the package, and
  every layer may import it;
- only the top-level modules (`__main__`, `program`, `cli`, `commands`) compose them all;
- exactly one module imports pynvml, and nothing below `__main__` calls sys.exit.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "deviceplugin"
FRONT_ENDS = ("kubelet", "ops")
DAEMONS = ("plugin", "dra")
LAYERS = ("wire", "model", "node", *FRONT_ENDS, "runtime", *DAEMONS, "explain", "sim")
ALLOWED: dict[str, tuple[str, ...]] = {
    "wire": ("wire",),
    "model": ("wire", "model"),
    "node": ("wire", "model", "node"),
    **{front_end: ("wire", "model", "node", front_end) for front_end in FRONT_ENDS},
    "runtime": ("wire", "model", "node", "ops", "runtime", "sim"),
    "plugin": ("wire", "model", "node", "kubelet", "ops", "runtime", "sim", "plugin"),
    "dra": ("wire", "model", "node", "ops", "runtime", "sim", "dra"),
    "explain": ("wire", "model", "node", "runtime", "sim", "explain"),
    "sim": ("wire", "model", "node", "sim"),
}
IO_LIBRARIES = ("pynvml", "grpc", "prometheus_client", "socket", "subprocess", "ctypes")


def modules() -> dict[str, ast.Module]:
    """Every module of the package, generated stubs included, by dotted name below
    `deviceplugin`."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts) or "__init__"
        found[name] = ast.parse(path.read_text(), filename=str(path))
    return found


def imported(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            assert node.level == 0, "the package uses absolute imports only"
            names.add(node.module)
    return names


def layer_of(module: str) -> str:
    """The layer of a dotted name below `deviceplugin`: its first directory; "root" for the
    top-level modules."""
    first = module.split(".")[0]
    return first if first in LAYERS else "root"


def violations(tree_by_module: Mapping[str, ast.Module]) -> list[str]:
    """Every import in the given modules that breaks the layering rule, as readable lines."""
    found = []
    for module, tree in sorted(tree_by_module.items()):
        layer = layer_of(module)
        if layer == "root":
            continue
        for name in sorted(imported(tree)):
            if name != "deviceplugin" and not name.startswith("deviceplugin."):
                continue
            target = name.removeprefix("deviceplugin").lstrip(".")
            if not target or target == "__version__":
                if layer in ("wire", "model", "node", "sim"):
                    found.append(f"{module} ({layer}) imports the package root")
                continue
            target_layer = layer_of(target)
            if target_layer in ALLOWED[layer]:
                continue
            found.append(f"{module} ({layer}) imports {target} ({target_layer})")
    return found


def test_the_package_keeps_its_layers() -> None:
    assert violations(modules()) == []


def test_every_layer_is_a_package_that_states_its_rule() -> None:
    for layer in LAYERS:
        init = PACKAGE / layer / "__init__.py"
        assert init.exists(), f"{layer} is not a package"
        docstring = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "May import" in docstring, f"{layer}/__init__.py does not say what it may import"


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        pytest.param(
            "model.devices",
            "from deviceplugin.node.nvml import Nvml",
            "model.devices (model) imports node.nvml (node)",
            id="model-imports-node",
        ),
        pytest.param(
            "node.health",
            "from deviceplugin.ops.metrics import Metrics",
            "node.health (node) imports ops.metrics (ops)",
            id="node-imports-front-end",
        ),
        pytest.param(
            "kubelet.registrar",
            "from deviceplugin.ops import metrics",
            "kubelet.registrar (kubelet) imports ops (ops)",
            id="front-end-imports-front-end",
        ),
        pytest.param(
            "ops.http",
            "import deviceplugin.plugin.supervisor",
            "ops.http (ops) imports plugin.supervisor (plugin)",
            id="front-end-imports-a-daemon",
        ),
        pytest.param(
            "dra.driver",
            "from deviceplugin.plugin.supervisor import Supervisor",
            "dra.driver (dra) imports plugin.supervisor (plugin)",
            id="daemon-imports-the-other",
        ),
        pytest.param(
            "dra.driver",
            "from deviceplugin.explain.claims import allocate_all",
            "dra.driver (dra) imports explain.claims (explain)",
            id="driver-imports-explain",
        ),
        pytest.param(
            "runtime.engine",
            "from deviceplugin.cli import parse_options",
            "runtime.engine (runtime) imports cli (root)",
            id="runtime-imports-root",
        ),
        pytest.param(
            "sim.kubelet",
            "from deviceplugin.kubelet.server import PluginServer",
            "sim.kubelet (sim) imports kubelet.server (kubelet)",
            id="sim-imports-front-end-logic",
        ),
        pytest.param(
            "wire.dra.v1.api_pb2_grpc",
            "from deviceplugin.model.errors import DevicePluginError",
            "wire.dra.v1.api_pb2_grpc (wire) imports model.errors (model)",
            id="wire-imports-the-package",
        ),
    ],
)
def test_a_broken_rule_is_reported(module: str, source: str, expected: str) -> None:
    assert violations({module: ast.parse(source)}) == [expected]


def test_allowed_imports_are_not_reported() -> None:
    allowed = {
        "node.discovery": ast.parse("from deviceplugin.model.devices import Gpu"),
        "kubelet.server": ast.parse("from deviceplugin.node.unixgrpc import listen_unix"),
        "sim.kubelet": ast.parse("from deviceplugin.wire.deviceplugin.v1beta1 import api_pb2_grpc"),
        "sim.pluginwatcher": ast.parse("from deviceplugin.wire.dra.v1 import api_pb2"),
        "kubelet.registration": ast.parse(
            "from deviceplugin.wire.deviceplugin.v1beta1 import api_pb2"
        ),
        "wire.dra.v1.api_pb2_grpc": ast.parse("from deviceplugin.wire.dra.v1 import api_pb2"),
        "plugin.supervisor": ast.parse("from deviceplugin.runtime.engine import NodeEngine"),
        "dra.driver": ast.parse("from deviceplugin.runtime.engine import NodeEngine"),
        "cli": ast.parse("from deviceplugin.plugin.service import serve"),
    }
    assert violations(allowed) == []


def test_only_the_nvml_module_imports_pynvml() -> None:
    importers = sorted(
        name
        for name, tree in modules().items()
        if any(n == "pynvml" or n.startswith("pynvml.") for n in imported(tree))
    )
    assert importers == ["node.nvml"]


# What `model/` may not touch, checked on every file under the directory: it does no I/O.
MODEL_IO_MODULES = (
    *IO_LIBRARIES,
    *("os", "stat", "io", "pathlib", "shutil", "tempfile", "importlib", "glob", "fcntl"),
    *("mmap", "select", "signal", "threading", "asyncio", "urllib", "http"),
)
FILE_METHODS = ("read_text", "read_bytes", "write_text", "write_bytes", "open", "mkdir", "unlink")


def io_done(tree: ast.Module) -> list[str]:
    """The I/O a module's source does: modules imported for it, `open()`, file methods."""
    found = [
        f"imports {name}"
        for name in sorted(imported(tree))
        if name.split(".")[0] in MODEL_IO_MODULES
    ]
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        if isinstance(node.func, ast.Name) and node.func.id == "open":
            found.append(f"calls open() on line {node.lineno}")
        if isinstance(node.func, ast.Attribute) and node.func.attr in FILE_METHODS:
            found.append(f"calls .{node.func.attr}() on line {node.lineno}")
    return found


def test_the_model_does_no_io() -> None:
    files = sorted((PACKAGE / "model").rglob("*.py"))
    assert len(files) > 5
    doing = {
        str(path.relative_to(PACKAGE)): io_done(ast.parse(path.read_text(), filename=str(path)))
        for path in files
    }
    assert {path: found for path, found in doing.items() if found} == {}


@pytest.mark.parametrize(
    "source",
    [
        pytest.param("import os", id="os"),
        pytest.param("from importlib import resources", id="package-data"),
        pytest.param("text = open('f').read()", id="open"),
        pytest.param("text = path.read_text()", id="read-text"),
    ],
)
def test_io_in_the_model_is_found(source: str) -> None:
    assert io_done(ast.parse(source)) != []


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
