"""What `serve` loads: only what its flags use, so it starts and stays lean (docs/performance.md).

Structural, not timed: the real command runs with `python -X importtime`, which logs every
module the interpreter imports, from exec until SIGTERM after start-up; the test reads that log.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from draplugin import DRIVER, published, short_dir, start_serve
from harness import GPU, run

from deviceplugin.cli import SERVE_ENV_VARS
from deviceplugin.sim.apiserver import ApiServer
from deviceplugin.sim.kubelet import KubeletEmulator
from deviceplugin.sim.pluginwatcher import PluginWatcher

PRESET = "a100-80gb-x8-mixed"
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
