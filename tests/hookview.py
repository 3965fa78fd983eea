"""What the memory-limit hook sees of a node, under a temp dir: a /proc (`self/cgroup`, the
namespace files of the hook and of the host's pid 1) and a cgroup v1 `memory` hierarchy with
kubelet-style pod and container cgroups. The hook reads them where its environment says
(DEVICEPLUGIN_HOOK_PROC, DEVICEPLUGIN_HOOK_CGROUPFS) and the simulated library caps whatever
directory it is given, so the hook runs as a runtime would run it in a pod's container."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import IO

POD = "8c1d2e3f-4a5b-4c6d-9e7f-0a1b2c3d4e5f"
OTHER_POD = "1f2e3d4c-5b6a-4978-8695-a4b3c2d1e0f9"
STATE = {"ociVersion": "1.2.0", "id": "c1", "status": "creating", "pid": 1, "bundle": "/b"}


class HookView:
    """A node's /proc and cgroups as the hook reads them; the hook is in the host's user and
    cgroup namespaces until a test says otherwise."""

    def __init__(self, root: Path) -> None:
        self.proc = root / "proc"
        self.cgroupfs = root / "cgroup"
        self.mount = self.cgroupfs / "memory"
        for space in ("cgroup", "user"):
            own = self.proc / "self" / "ns" / space
            own.parent.mkdir(parents=True, exist_ok=True)
            own.write_text(f"the hook's {space} namespace")
            host = self.proc / "1" / "ns" / space
            host.parent.mkdir(parents=True, exist_ok=True)
            host.symlink_to(own)
        self.enter(POD, "c1")

    @property
    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "DEVICEPLUGIN_HOOK_PROC": str(self.proc),
            "DEVICEPLUGIN_HOOK_CGROUPFS": str(self.cgroupfs),
        }

    def pod(self, uid: str = POD) -> str:
        """The sysfs path of a pod's cgroup (made)."""
        path = self.mount / "kubepods" / "burstable" / f"pod{uid}"
        path.mkdir(parents=True, exist_ok=True)
        return str(path)

    def enter(self, pod: str, container: str) -> str:
        """Put the hook in a container's cgroup (made) of a pod; its path."""
        path = Path(self.pod(pod)) / container
        path.mkdir(exist_ok=True)
        self.claim_cgroup(str(path.relative_to(self.mount)))
        return str(path)

    def claim_cgroup(self, relative: str) -> None:
        """What /proc/self/cgroup says, as given: the memory controller's path `/<relative>`."""
        (self.proc / "self" / "cgroup").write_text(f"4:memory:/{relative}\n0::/\n")

    def foreign_namespace(self, space: str, reachable: bool) -> None:
        """The hook in a private namespace of `space`, the host's pid 1 one it cannot enter
        (`reachable`) or cannot open at all."""
        host = self.proc / "1" / "ns" / space
        host.unlink()
        if reachable:
            host.write_text(f"the host's {space} namespace")


def run_hook(
    program: str | Path,
    args: list[str],
    view: HookView,
    state: str = json.dumps(STATE),
    prefix: tuple[str, ...] = (),
) -> subprocess.CompletedProcess[str]:
    """The hook as runc runs it: `args` (args[0] its name), the state on stdin."""
    return subprocess.run(
        [*prefix, str(program), *args[1:]],
        input=state,
        env=view.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def stalled_hook(program: str | Path, args: list[str], view: HookView) -> subprocess.Popen[str]:
    """The hook started with a stdin that is never closed."""
    return subprocess.Popen(
        [str(program), *args[1:]],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=view.env,
        text=True,
    )


def finish(process: subprocess.Popen[str]) -> tuple[int, str]:
    """The stalled hook's exit status and stderr once it gives up (bounded), stdin closed after."""
    stdin: IO[str] | None = process.stdin
    try:
        status = process.wait(timeout=60)
        assert process.stderr is not None
        return status, process.stderr.read()
    finally:
        process.kill()
        process.wait()
        if stdin is not None:
            stdin.close()
        if process.stderr is not None:
            process.stderr.close()
