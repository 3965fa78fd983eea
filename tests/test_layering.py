"""The architecture's rules, checked on the source (docs/architecture.md draws them). A module's
layer is the directory it sits in, with no exceptions:

- `model` imports nothing of the package and does no I/O (every file under model/ is checked);
- `node` imports `model` only;
- a front-end (`kubelet`, `ops`) imports `model` and `node`, never another front-end;
- `runtime`, what both daemons share (the engine), imports `model`, `node` and `ops`, never
  `sim`: the simulator is built by the composition and handed down (`runtime.host.Simulator`);
- the two daemons, `plugin` and `dra`, sit side by side over `runtime`: neither imports the
  other, nor `explain`;
- `explain` (`dra explain` and its API and scheduler emulation) imports no daemon;
- `sim` imports `model` and `node`;
- `wire`, the generated gRPC stubs of the kubelet APIs, imports nothing else of the package, and
  every layer may import it;
- only the top-level modules (`__main__`, `program`, `cli`, `commands`) and `demos` (a daemon
  wired to sim's emulators) compose them all; every other package is a layer;
- exactly one module imports pynvml, and nothing below `__main__` calls sys.exit;
- no two modules, and no two layers, import each other, however indirectly;
- beside the package, the benchmarks (`bench/`) and the end-to-end tests (`e2e/`) do not import
  each other, and what both use (`testbed/`) imports neither.
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
    "runtime": ("wire", "model", "node", "ops", "runtime"),
    "plugin": ("wire", "model", "node", "kubelet", "ops", "runtime", "sim", "plugin"),
    "dra": ("wire", "model", "node", "ops", "runtime", "sim", "dra"),
    "explain": ("wire", "model", "node", "runtime", "sim", "explain"),
    "sim": ("wire", "model", "node", "sim"),
}
# Packages that compose, as the top-level modules do: the root's rules.
COMPOSITION = ("demos",)
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
    top-level modules and the composition packages."""
    first = module.split(".")[0]
    return first if first in LAYERS else "root"


def test_every_package_is_a_layer_or_composes() -> None:
    """A new directory is not the root by default: it is given a rule, or named as composing."""
    packages = {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    assert packages - {*LAYERS, *COMPOSITION} == set()


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
            "runtime.host",
            "def open_nvml():\n    from deviceplugin.sim.fake_nvml import FakeNvml",
            "runtime.host (runtime) imports sim.fake_nvml (sim)",
            id="runtime-imports-sim-lazily",
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


def module_graph(tree_by_module: Mapping[str, ast.Module]) -> dict[str, set[str]]:
    """Which of the given modules each one imports. Every import statement counts, wherever it
    sits (top level, a function, `if TYPE_CHECKING:`): one deferred to save start-up time is
    still a dependency, and deferring it must not hide a cycle. `from deviceplugin.a import b`
    is an edge to `a.b` when that is a module, else to `a`; the package root is `__init__`."""
    graph: dict[str, set[str]] = {}
    for module, tree in tree_by_module.items():
        targets: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                targets.update(
                    full if full.removeprefix("deviceplugin.") in tree_by_module else node.module
                    for full in (f"{node.module}.{alias.name}" for alias in node.names)
                )
        names = {
            t.removeprefix("deviceplugin").lstrip(".") or "__init__"
            for t in targets
            if t == "deviceplugin" or t.startswith("deviceplugin.")
        }
        graph[module] = {n for n in names if n in tree_by_module and n != module}
    return graph


def layer_graph(graph: Mapping[str, set[str]]) -> dict[str, set[str]]:
    """The module graph folded onto layers; the package root (`__init__`, which holds only the
    version) is a node of its own, not the composing top level."""

    def node(module: str) -> str:
        return module if module == "__init__" else layer_of(module)

    folded: dict[str, set[str]] = {}
    for module, targets in graph.items():
        folded.setdefault(node(module), set()).update(node(t) for t in targets)
    return {layer: targets - {layer} for layer, targets in folded.items()}


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted: every
    set of nodes that import each other, directly or through others."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = [stack.pop()]
            while component[-1] != node:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_no_two_modules_import_each_other() -> None:
    assert cycles(module_graph(modules())) == []


def test_no_two_layers_import_each_other() -> None:
    assert cycles(layer_graph(module_graph(modules()))) == []


@pytest.mark.parametrize(
    ("sources", "expected"),
    [
        pytest.param(
            {
                "dra.opaque": "from deviceplugin.dra.opaqueschema import sharing_of",
                "dra.opaqueschema": "from deviceplugin.dra.opaque import OpaqueConfigError",
            },
            [["dra.opaque", "dra.opaqueschema"]],
            id="two-modules",
        ),
        pytest.param(
            {
                "dra.opaque": "def parse():\n    from deviceplugin.dra import opaqueschema",
                "dra.opaqueschema": "import deviceplugin.dra.opaque",
            },
            [["dra.opaque", "dra.opaqueschema"]],
            id="deferred-into-a-function",
        ),
        pytest.param(
            {
                "node.a": "from deviceplugin.node.b import B",
                "node.b": "from deviceplugin.node.c import C",
                "node.c": "from deviceplugin.node import a",
            },
            [["node.a", "node.b", "node.c"]],
            id="through-a-third",
        ),
    ],
)
def test_a_module_cycle_is_found(sources: dict[str, str], expected: list[list[str]]) -> None:
    trees = {module: ast.parse(source) for module, source in sources.items()}
    assert cycles(module_graph(trees)) == expected


def test_a_layer_cycle_is_found_where_the_modules_have_none() -> None:
    trees = {
        "sim.pluginwatcher": ast.parse("from deviceplugin.dra.plugin import DraPlugin"),
        "dra.plugin": ast.parse("from deviceplugin.sim.fake_nvml import FakeNvml"),
        "sim.fake_nvml": ast.parse(""),
        "cli": ast.parse(
            "from deviceplugin import __version__\nfrom deviceplugin.ops import metrics"
        ),
        "ops.metrics": ast.parse("from deviceplugin import __version__"),
        "__init__": ast.parse(""),
    }
    assert cycles(module_graph(trees)) == []
    assert cycles(layer_graph(module_graph(trees))) == [["dra", "sim"]]


# Beside the package: which of the repository's other trees each may not import.
HARNESS_FORBIDDEN = {"bench": ("e2e",), "e2e": ("bench",), "testbed": ("bench", "e2e")}


def harness_violations(tree_by_file: Mapping[str, ast.Module]) -> list[str]:
    """Imports from a file under bench/, e2e/ or testbed/ of a tree it may not import."""
    found = []
    for file, tree in sorted(tree_by_file.items()):
        forbidden = HARNESS_FORBIDDEN[file.split("/")[0]]
        for name in sorted(imported(tree)):
            if name.split(".")[0] in forbidden:
                found.append(f"{file} imports {name}")
    return found


def test_bench_and_e2e_do_not_import_each_other() -> None:
    files = {
        str(path.relative_to(PACKAGE.parent)): ast.parse(path.read_text(), filename=str(path))
        for tree in HARNESS_FORBIDDEN
        for path in sorted((PACKAGE.parent / tree).rglob("*.py"))
    }
    assert len(files) > 20
    assert harness_violations(files) == []


def test_a_harness_import_across_is_found() -> None:
    files = {
        "bench/reference.py": ast.parse("from e2e.reference import compat"),
        "e2e/reference/health.py": ast.parse("import bench.process"),
        "testbed/plugins.py": ast.parse("from testbed.process import Child"),
    }
    assert harness_violations(files) == [
        "bench/reference.py imports e2e.reference",
        "e2e/reference/health.py imports bench.process",
    ]
