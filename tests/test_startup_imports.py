"""What `serve` and `dra serve` load: only what their flags use, so they start and stay lean
(docs/performance.md); and what they weigh, against the budgets of `testbed/budgets.py`.

Structural, not timed: the real command runs with `python -X importtime`, which logs every
module the interpreter imports, from exec until SIGTERM after start-up; the test reads that log.
The budget tests read the modules a daemon holds from the daemon itself (a sitecustomize that
writes `sys.modules` on SIGUSR1) and its RSS from /proc, at registration and first publish, and
for `serve` after 2,000 Allocates too. Times are the benchmark's (`make bench`), not asserted.
"""

from __future__ import annotations

import asyncio
import compileall
import os
import re
import shutil
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from draplugin import DRIVER, published, short_dir, start_serve
from harness import GPU, run

import deviceplugin
from deviceplugin.cli import SERVE_ENV_VARS
from deviceplugin.demos.plugin import SEED_CONFIG, write_configmap
from deviceplugin.sim.apiserver import ApiServer
from deviceplugin.sim.kubelet import KubeletEmulator
from deviceplugin.sim.pluginwatcher import PluginWatcher
from deviceplugin.wire.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from testbed import budgets
from testbed.budgets import MIB
from testbed.process import rss_bytes

PRESET = "a100-80gb-x8-mixed"
ALLOCATES = 2000
# What `serve` never needs on its default flags: the DRA driver, its kubelet APIs, its Kubernetes
# client and CEL, the HTTP endpoints with prometheus-client and the pod-resources client behind
# them, and the schema library the DRA driver's opaque configs use.
HEAVY = (
    "deviceplugin.dra",
    "deviceplugin.wire.dra",
    "deviceplugin.wire.drahealth",
    "deviceplugin.wire.pluginregistration",
    "deviceplugin.runtime.kubeclient",
    "lightkube",
    "httpx2",
    "cel_expr_python",
    "deviceplugin.ops.http",
    "prometheus_client",
    "deviceplugin.kubelet.pods",
    "deviceplugin.wire.podresources",
    "pydantic",
)
# Not heavy, but needed only by what default flags leave off: the CDI spec's builder and host
# scan (a CDI strategy), what /readyz and /status report and the pods holding devices (HTTP).
UNUSED_ON_DEFAULT_FLAGS = (
    "deviceplugin.model.cdi",
    "deviceplugin.node.hostscan",
    "deviceplugin.ops.status",
    "deviceplugin.model.assignments",
)
_IMPORTED = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)$")


async def _imports_of_serve(tmp_path: Path, *flags: str, registered: Sequence[str]) -> set[str]:
    """Every module `deviceplugin serve FLAGS` imports up to SIGTERM, once the emulated kubelet
    holds `registered` (or, with none, once the plugin says it started)."""
    kubelet = KubeletEmulator(tmp_path / "kubelet")
    await kubelet.start()
    env = {k: v for k, v in os.environ.items() if k not in SERVE_ENV_VARS}
    serve = await asyncio.create_subprocess_exec(
        *(sys.executable, "-X", "importtime", "-m", "deviceplugin", "serve"),
        # never the host's spec directory: serve removes a spec there that it does not want
        *("--kubelet-dir", str(kubelet.directory), "--cdi-spec-dir", str(tmp_path / "cdi")),
        *flags,
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    assert serve.stderr is not None
    lines: list[str] = []
    try:
        async with asyncio.timeout(30):
            while not any("plugin.started" in line for line in lines):
                line = await serve.stderr.readline()
                assert line, "serve exited:\n" + "".join(lines[-20:])
                lines.append(line.decode(errors="replace"))
            ready = lambda: all(name in kubelet.endpoints for name in registered)  # noqa: E731
            assert await kubelet.wait_for(ready, 10)
        serve.send_signal(signal.SIGTERM)
        _, rest = await asyncio.wait_for(serve.communicate(), 10)
        lines += rest.decode(errors="replace").splitlines()
        assert serve.returncode == 0
    finally:
        if serve.returncode is None:
            serve.kill()
            await serve.wait()
        await kubelet.stop()
    return {m.group(1) for line in lines if (m := _IMPORTED.match(line.rstrip("\n")))}


def _loaded(imports: set[str], packages: Sequence[str]) -> list[str]:
    """The `packages` (or modules below them) among `imports`."""
    return sorted(p for p in packages if any(m == p or m.startswith(p + ".") for m in imports))


def _imports_on_preset(tmp_path: Path, *flags: str) -> set[str]:
    """What `serve --simulate PRESET FLAGS` imports until its GPU resource is registered."""
    return run(_imports_of_serve(tmp_path, "--simulate", PRESET, *flags, registered=(GPU,)))


def test_serve_on_default_flags_loads_no_heavy_module(tmp_path: Path) -> None:
    imports = _imports_on_preset(tmp_path)
    assert {"grpc", "deviceplugin.plugin.supervisor", "deviceplugin.sim.fake_nvml"} <= imports
    assert _loaded(imports, HEAVY) == []
    assert _loaded(imports, UNUSED_ON_DEFAULT_FLAGS) == []


def test_a_cdi_strategy_loads_the_spec_builder(tmp_path: Path) -> None:
    imports = _imports_on_preset(tmp_path, "--device-list-strategy", "cdi-cri")
    expected = ["deviceplugin.model.cdi", "deviceplugin.node.hostscan"]
    assert _loaded(imports, UNUSED_ON_DEFAULT_FLAGS) == expected
    assert (tmp_path / "cdi" / "k8s.device-plugin.nvidia.com-gpu.json").is_file()


def test_http_address_loads_the_http_stack(tmp_path: Path) -> None:
    imports = _imports_on_preset(tmp_path, "--http-address", "127.0.0.1:0")
    assert _loaded(imports, HEAVY) == [
        "deviceplugin.kubelet.pods",
        "deviceplugin.ops.http",
        "deviceplugin.wire.podresources",
        "prometheus_client",
    ]


def test_a_real_node_loads_no_simulator(tmp_path: Path) -> None:
    """Without --simulate (no NVML here, so nothing to advertise: serve idles) the simulator,
    its node files and YAML presets stay unloaded; pynvml is what is opened."""
    imports = run(_imports_of_serve(tmp_path, "--fail-on-init-error", "false", registered=()))
    assert "pynvml" in imports
    assert _loaded(imports, ("deviceplugin.sim", *HEAVY)) == []


def test_dra_serve_loads_no_pydantic_until_a_claim_carries_parameters() -> None:
    """`dra serve` publishes and registers without pydantic: only a claim with opaque parameters
    of this driver needs its models (`dra/opaqueschema.py`). Without `--http-address` it loads
    no metrics or HTTP stack either."""

    async def body() -> set[str]:
        root = short_dir()
        server = ApiServer()
        await server.start()
        watcher = PluginWatcher(root / "kubelet")
        await watcher.start()
        serve = await start_serve(root, server.url, root / "kubelet", PYTHONPROFILEIMPORTTIME="1")
        assert serve.stderr is not None
        stderr = asyncio.create_task(serve.stderr.read())  # drained as it comes: ~100 KB
        try:
            await watcher.wait_registered(DRIVER, 30)
            assert published(server)
            serve.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(serve.wait(), 10) == 0
            lines = (await stderr).decode(errors="replace").splitlines()
        finally:
            if serve.returncode is None:
                serve.kill()
                await serve.wait()
            await watcher.stop()
            await server.stop()
            shutil.rmtree(root, ignore_errors=True)
        return {m.group(1) for line in lines if (m := _IMPORTED.match(line))}

    imports = run(body())
    assert {"deviceplugin.dra.driver", "deviceplugin.dra.opaque"} <= imports
    assert _loaded(imports, ("pydantic", "deviceplugin.dra.opaqueschema")) == []
    # nor, without --http-address, the metrics and HTTP stack (as `serve`)
    assert _loaded(imports, ("prometheus_client", "deviceplugin.ops.http")) == []


# --- budgets: RSS and the modules loaded, against testbed/budgets.py ----------------------------

# Put on a daemon's PYTHONPATH: on SIGUSR1 it writes the names of the modules it has loaded.
_MODULES_ON_SIGNAL = """\
import os, signal, sys

def _write_modules(*_):
    names = sorted(name for name, module in sys.modules.items() if module is not None)
    with open(os.environ["DP_TEST_MODULES_FILE"], "w") as out:
        out.write("\\n".join(names))

signal.signal(signal.SIGUSR1, _write_modules)
"""


@pytest.fixture(scope="module", autouse=True)
def _bytecode() -> None:
    """The package's bytecode, written as `make test` writes it first: a daemon that has to
    compile its modules itself (PYTHONDONTWRITEBYTECODE set, or sources newer than their
    bytecode) weighs about 5 MiB more, the compiler's memory rather than the daemon's."""
    compileall.compile_dir(Path(deviceplugin.__file__).parent, quiet=1)


@dataclass
class Weighed:
    """A daemon's loaded modules and RSS (MiB) at the points the budgets hold."""

    modules: set[str] = field(default_factory=set)
    rss: dict[str, float] = field(default_factory=dict)


def _observed_env(root: Path) -> dict[str, str]:
    """The environment that makes a daemon write its modules on SIGUSR1 (to root/modules)."""
    site = root / "observer"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_MODULES_ON_SIGNAL)
    return {"PYTHONPATH": str(site), "DP_TEST_MODULES_FILE": str(root / "modules")}


async def _modules_of(pid: int, root: Path) -> set[str]:
    """The modules process `pid` has loaded now, as its sitecustomize writes them."""
    written = root / "modules"
    written.unlink(missing_ok=True)
    os.kill(pid, signal.SIGUSR1)
    for _ in range(500):
        if written.is_file() and written.read_text():
            return set(written.read_text().split("\n"))
        await asyncio.sleep(0.02)
    raise AssertionError("the daemon never wrote its modules")


def _rss_mib(pid: int) -> float:
    return rss_bytes(pid) / MIB


async def _stop(daemon: asyncio.subprocess.Process) -> None:
    """SIGTERM: the daemon exits 0 within 10 s; killed if it has not exited by then."""
    try:
        if daemon.returncode is None:
            daemon.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(daemon.wait(), 10) == 0
    finally:
        if daemon.returncode is None:
            daemon.kill()
            await daemon.wait()


_INTERPRETER = ("__main__", "cython_runtime", "sitecustomize", "_distutils_hack")
_SETUP = ("__editable__", "_cython_")  # an editable install's finder; Cython's runtime modules


def _beyond(modules: set[str], ours: frozenset[str], packages: frozenset[str]) -> list[str]:
    """The modules the budget does not hold: ours by name, the standard library's if heavy,
    any other by its top-level package."""
    new: set[str] = set()
    for name in modules:
        top = name.split(".")[0]
        if top == "deviceplugin":
            if name not in ours:
                new.add(name)
        elif top in sys.stdlib_module_names or top in _INTERPRETER or top.startswith(_SETUP):
            continue  # the interpreter's and the install's own
        elif top not in packages:
            new.add(top)
    return sorted(new)


def _check(
    what: str,
    weighed: Weighed,
    budget: float,
    ours: frozenset[str],
    packages: frozenset[str],
    heavy: frozenset[str],
) -> None:
    """Fail past the budget, naming what is new (testbed/budgets.py)."""
    new = _beyond(weighed.modules, ours, packages)
    heavy_loaded = sorted(heavy & weighed.modules)
    where = "testbed/budgets.py"
    assert new == [], f"{what} loads modules its budget ({where}) does not hold: {new}"
    assert heavy_loaded == [], f"{what} loads {heavy_loaded}, which {where} keeps out"
    over = {point: rss for point, rss in weighed.rss.items() if rss > budget}
    assert over == {}, (
        f"{what}: RSS {over} MiB over its budget of {budget} MiB ({where}); it loads no module "
        "the budget does not hold, so what grew is what a listed module holds or loads"
    )


def test_serve_stays_within_its_budgets(tmp_path: Path) -> None:
    """`serve` on the seed node (mixed MIG, whole GPUs time-sliced 8 ways): its modules once
    registered, its RSS then and after 2,000 Allocates."""

    async def body() -> Weighed:
        weighed = Weighed()
        kubelet = KubeletEmulator(tmp_path / "kubelet")
        await kubelet.start()
        config = write_configmap(tmp_path / "cm", SEED_CONFIG.format(replicas=8))
        env = {k: v for k, v in os.environ.items() if k not in SERVE_ENV_VARS}
        serve = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "deviceplugin", "serve", "--simulate", PRESET),
            *("--kubelet-dir", str(kubelet.directory), "--cdi-spec-dir", str(tmp_path / "cdi")),
            *("--config-file", str(config)),
            env={**env, **_observed_env(tmp_path)},
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        try:
            listed = lambda: len(kubelet.devices(GPU)) == 4 * 8  # noqa: E731
            assert await kubelet.wait_for(listed, 30), "serve never registered its GPUs"
            weighed.modules = await _modules_of(serve.pid, tmp_path)
            weighed.rss["registered"] = _rss_mib(serve.pid)
            socket = kubelet.directory / kubelet.endpoints[GPU].endpoint
            ids = sorted(kubelet.devices(GPU))
            async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
                plugin = api_pb2_grpc.DevicePluginStub(channel)
                for i in range(ALLOCATES):
                    request = api_pb2.ContainerAllocateRequest(devices_ids=[ids[i % len(ids)]])
                    await plugin.Allocate(
                        api_pb2.AllocateRequest(container_requests=[request]), timeout=10
                    )
            weighed.rss[f"after {ALLOCATES} Allocates"] = _rss_mib(serve.pid)
        finally:
            await _stop(serve)
            await kubelet.stop()
        return weighed

    weighed = run(body())
    assert "deviceplugin.plugin.supervisor" in weighed.modules  # it did observe serve
    _check(
        "serve",
        weighed,
        budgets.SERVE_RSS_MIB,
        budgets.SERVE_MODULES,
        budgets.SERVE_PACKAGES,
        budgets.HEAVY_STDLIB,
    )


def test_dra_serve_stays_within_its_budgets() -> None:
    """`dra serve` on the same preset: its modules and RSS once its slices are published and
    the kubelet has registered it."""

    async def body() -> Weighed:
        weighed = Weighed()
        root = short_dir()
        server = ApiServer()
        await server.start()
        watcher = PluginWatcher(root / "kubelet")
        await watcher.start()
        serve = await start_serve(root, server.url, root / "kubelet", **_observed_env(root))
        try:
            await watcher.wait_registered(DRIVER, 30)
            for _ in range(1500):
                if published(server):
                    break
                await asyncio.sleep(0.02)
            assert published(server), "dra serve never published"
            weighed.modules = await _modules_of(serve.pid, root)
            weighed.rss["published"] = _rss_mib(serve.pid)
        finally:
            await _stop(serve)
            await watcher.stop()
            await server.stop()
            shutil.rmtree(root, ignore_errors=True)
        return weighed

    weighed = run(body())
    assert "deviceplugin.dra.driver" in weighed.modules
    _check(
        "dra serve",
        weighed,
        budgets.DRA_SERVE_RSS_MIB,
        budgets.DRA_SERVE_MODULES,
        budgets.DRA_SERVE_PACKAGES,
        budgets.DRA_HEAVY_STDLIB,
    )
