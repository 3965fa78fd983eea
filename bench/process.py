"""Child processes of the benchmark (`deviceplugin serve`, `dra serve`, their floors), as
`testbed.process.Child`ren watched from /proc, and the bytecode they start from.
"""

from __future__ import annotations

import compileall
from pathlib import Path

from testbed.process import PYTHON, REPO, Child

_CONSOLE = Path(PYTHON).parent / "deviceplugin"


def compile_sources() -> None:
    """Write the bytecode of the package and the benchmark, as pip does when it installs the
    package: a start-up is then measured as a node runs it, not with every module compiled
    from source first (an editable checkout under PYTHONDONTWRITEBYTECODE=1 would)."""
    for directory in ("deviceplugin", "bench"):
        compileall.compile_dir(REPO / directory, quiet=1)


def _deviceplugin() -> list[str]:
    """The installed console script, or the package run as a module when there is none."""
    return [str(_CONSOLE)] if _CONSOLE.exists() else [PYTHON, "-m", "deviceplugin"]


def serve(
    root: Path,
    kubelet_dir: Path,
    simulate: str,
    config_file: Path | None = None,
    events: Path | None = None,
) -> Child:
    """A `deviceplugin serve` on a simulated node, logging to <root>/serve.log (not started)."""
    argv = [*_deviceplugin(), "serve", "--simulate", simulate, "--kubelet-dir", str(kubelet_dir)]
    # Never the host's spec directory: serve removes a spec it does not want, and this host may
    # be a real node (or run the real-cluster tests) whose plugin wrote one there.
    argv += ["--cdi-spec-dir", str(root / "cdi")]
    if config_file is not None:
        argv += ["--config-file", str(config_file)]
    if events is not None:
        argv += ["--simulate-events", str(events)]
    return Child(argv, root / "serve.log")


def dra_serve(root: Path, kubelet_root: Path, simulate: str, kubeconfig: Path, node: str) -> Child:
    """A `deviceplugin dra serve` on a simulated node, publishing to the API server named in
    `kubeconfig`, logging to <root>/dra-serve.log (not started)."""
    argv = [*_deviceplugin(), "dra", "serve", "--simulate", simulate, "--node-name", node]
    argv += ["--kubelet-root", str(kubelet_root), "--kubeconfig", str(kubeconfig)]
    argv += ["--cdi-spec-dir", str(root / "cdi")]
    return Child(argv, root / "dra-serve.log")


def echo(
    root: Path, socket: Path, answers: Path | None = None, register: str | None = None
) -> Child:
    """The bare grpc.aio baseline server of bench/echo.py (not started)."""
    argv = [PYTHON, "-m", "bench.echo", str(socket)]
    if answers is not None:
        argv += ["--answers", str(answers)]
    if register is not None:
        argv += ["--register", register]
    return Child(argv, root / "echo.log")


def dra_floor(root: Path, socket: Path, url: str, body: Path, info: Path) -> Child:
    """The floor under `dra serve` of bench/drafloor.py, publishing the slice in `body` to the
    API server at `url`, its GetInfo answering the PluginInfo bytes in `info` (not started)."""
    argv = [PYTHON, "-m", "bench.drafloor", str(socket), url, str(body), str(info)]
    return Child(argv, root / "drafloor.log")
