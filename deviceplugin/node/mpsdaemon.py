"""The MPS control daemons of the node, run through the driver root's `nvidia-cuda-mps-control`
as NVIDIA's `mps-control-daemon` runs them: compute mode EXCLUSIVE_PROCESS on the daemon's GPUs,
`nvidia-cuda-mps-control -d` with CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY, then the
limits piped through `nvidia-cuda-mps-control` on stdin; `quit` and compute mode DEFAULT again
when the daemon is no longer wanted.

`MpsDaemons.apply` makes the running daemons those of the plan: a daemon whose spec (paths,
GPUs, limits) is unchanged is left alone, a changed one is restarted, one no longer wanted is
stopped. `check` asks each daemon for its thread percentage, as the reference plugin checks its
daemon's health; a daemon that does not answer is down (its resource's devices are Unhealthy,
`model.mps.with_daemons_down`) and is started again at the next check. Subprocesses run on the
event loop with a deadline each, so a stuck control program never stalls Allocate.

Two plugin pods overlap on a node during a rolling update (`maxSurge`), and both manage the
same daemons under mpsRoot. Whoever starts or adopts a daemon writes its mark (`owner.json`
beside the pipe directory: its own token and the commands it told the daemon). A newcomer finds
a daemon that answers with the commands it would send and adopts it, rather than restarting it
under running clients; a plugin whose mark is no longer there leaves the daemon and the compute
modes alone when it stops, since its successor serves them now.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

from deviceplugin.model.errors import ConfigError, DevicePluginError
from deviceplugin.model.log import log_event
from deviceplugin.model.mps import DaemonSpec
from deviceplugin.node.mpsshm import prepare_shm, unsafe_directory

logger = logging.getLogger(__name__)

CONTROL_PROGRAM = "usr/bin/nvidia-cuda-mps-control"
COMMAND_SECONDS = 10.0  # one control command; NVIDIA's answers in milliseconds
# nvmlComputeMode_t
COMPUTE_MODE_DEFAULT, COMPUTE_MODE_EXCLUSIVE_PROCESS = 0, 3

SetComputeMode = Callable[[str, int], Awaitable[None]]


class MpsError(DevicePluginError):
    """A control daemon could not be started or told its limits."""


def control_program(driver_root: str) -> Path:
    """The driver root's `nvidia-cuda-mps-control`. Raises ConfigError naming the driver root
    when it has none: `sharing.mps` cannot be served from it."""
    program = Path(driver_root) / CONTROL_PROGRAM
    if not os.access(program, os.X_OK):
        raise ConfigError(
            "flags.nvidiaDriverRoot",
            f"sharing.mps needs NVIDIA's MPS control program, and {driver_root} has no "
            f"executable {CONTROL_PROGRAM}",
        )
    return program


class MpsControl:
    """One control program, run for one daemon at a time. `setting` names what placed the
    daemons' directories, in the error that refuses one."""

    def __init__(self, program: Path, setting: str = "flags.mpsRoot") -> None:
        self.program = program
        self.setting = setting

    async def run(self, spec: DaemonSpec, *arguments: str, stdin: str = "") -> str:
        """The program's output; raises MpsError when it fails or overruns its deadline."""
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "CUDA_MPS_PIPE_DIRECTORY": spec.pipe_dir,
            "CUDA_MPS_LOG_DIRECTORY": spec.log_dir,
        }
        what = f"{self.program.name} {' '.join(arguments) or stdin.strip()}"
        try:
            process = await asyncio.create_subprocess_exec(
                str(self.program),
                *arguments,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
            )
        except OSError as exc:
            raise MpsError(f"{spec.resource}: cannot run {what}: {exc.strerror}") from None
        try:
            out, err = await asyncio.wait_for(process.communicate(stdin.encode()), COMMAND_SECONDS)
        except TimeoutError:
            process.kill()
            await process.wait()
            raise MpsError(
                f"{spec.resource}: {what} did not finish within {COMMAND_SECONDS} s"
            ) from None
        if process.returncode != 0:
            said = err.decode(errors="replace").strip() or f"exit status {process.returncode}"
            raise MpsError(f"{spec.resource}: {what} failed: {said}")
        return out.decode(errors="replace")

    async def start(self, spec: DaemonSpec) -> None:
        """Start the daemon in its directories (the shm a tmpfs where it can be, `node.mpsshm`)
        and tell it its limits. Nothing is made or mounted through a link, nor under /dev,
        /proc or /sys."""
        directories = (spec.pipe_dir, spec.log_dir, spec.shm_dir)
        base = os.path.commonpath(directories)
        for directory in directories:
            if (why := unsafe_directory(base, directory)) is not None:
                raise MpsError(f"{spec.resource}: {self.setting}: {why}")
        try:
            for directory in (spec.pipe_dir, spec.log_dir):
                Path(directory).mkdir(parents=True, exist_ok=True)
            prepare_shm(spec.shm_dir)
        except OSError as exc:
            raise MpsError(
                f"{spec.resource}: cannot create {exc.filename}: {exc.strerror}"
            ) from None
        await self.run(spec, "-d")
        for command in spec.commands():
            await self.run(spec, stdin=command)

    async def healthy(self, spec: DaemonSpec) -> bool:
        try:
            await self.run(spec, stdin="get_default_active_thread_percentage")
        except MpsError:
            return False
        return True

    async def quit(self, spec: DaemonSpec) -> None:
        """Ask the daemon to quit; one that is not running is gone already."""
        try:
            await self.run(spec, stdin="quit")
        except MpsError as exc:
            log_event(logger, "mps.quit_failed", logging.DEBUG, error=str(exc))


OWNER_FILE = "owner.json"


def _owner_path(spec: DaemonSpec) -> Path:
    return Path(spec.pipe_dir).parent / OWNER_FILE


def read_owner(spec: DaemonSpec) -> dict[str, object] | None:
    """The daemon's mark: {"owner": token, "commands": [...]}; None when absent or unreadable."""
    try:
        mark = json.loads(_owner_path(spec).read_text())
    except (OSError, ValueError):
        return None
    return mark if isinstance(mark, dict) else None


def _write_owner(spec: DaemonSpec, owner: str) -> None:
    path = _owner_path(spec)
    scratch = path.with_name(f".{OWNER_FILE}.{owner}")
    scratch.write_text(json.dumps({"owner": owner, "commands": list(spec.commands())}))
    scratch.replace(path)  # atomic: the other plugin reads a whole mark or the old one


class MpsDaemons:
    """The daemons running for the plan in force, and those that are down."""

    def __init__(self, set_compute_mode: SetComputeMode) -> None:
        self._set_compute_mode = set_compute_mode
        self.owner = os.urandom(16).hex()  # this plugin's mark on the daemons it serves
        self.control: MpsControl | None = None
        self.running: dict[str, DaemonSpec] = {}  # started, whether answering or not
        self.down: dict[str, str] = {}  # resource -> why its daemon does not serve

    async def apply(self, desired: Mapping[str, DaemonSpec], control: MpsControl | None) -> None:
        """Make the running daemons `desired`, through `control` (None: no daemon wanted)."""
        for name, spec in list(self.running.items()):
            if desired.get(name) != spec or control is None:
                await self._stop(name, keep=desired.get(name))
        self.control = control
        for name, spec in desired.items():
            if name not in self.running:
                await self._start(spec)

    async def check(self) -> bool:
        """Check every daemon: one that no longer answers is down (the kubelet is told through
        its devices' health); one down is started again, at the next check, not in the same
        one, so a daemon that keeps dying is not restarted in a tight loop. True when one went
        down or came back."""
        control, before = self.control, dict(self.down)
        if control is None:
            return False
        for name, spec in self.running.items():
            if name in before:
                await self._start(spec)
            elif not await control.healthy(spec):
                self._mark_down(name, f"MPS control daemon of {name} is not running")
                await control.quit(spec)  # a stuck daemon's socket and lock freed
        return self.down != before

    async def stop_all(self) -> None:
        for name in list(self.running):
            await self._stop(name, keep=None)

    async def _start(self, spec: DaemonSpec) -> None:
        assert self.control is not None
        self.running[spec.resource] = spec
        for uuid in spec.gpu_uuids:
            try:
                await self._set_compute_mode(uuid, COMPUTE_MODE_EXCLUSIVE_PROCESS)
            except DevicePluginError as exc:  # NVML refuses a MIG-enabled GPU's own handle
                log_event(logger, "mps.compute_mode_failed", logging.WARNING, error=str(exc))
        try:
            adopted = await self._adopt(spec)
            if not adopted:
                await self.control.quit(spec)  # one left behind, told other limits
                await self.control.start(spec)
            _write_owner(spec, self.owner)
        except (DevicePluginError, OSError) as exc:
            self._mark_down(spec.resource, f"MPS control daemon of {spec.resource}: {exc}")
            return
        if self.down.pop(spec.resource, None) is not None:
            log_event(logger, "mps.daemon_recovered", resource=spec.resource)
        log_event(
            logger,
            "mps.daemon_adopted" if adopted else "mps.daemon_started",
            resource=spec.resource,
            pipe=spec.pipe_dir,
            gpus=len(spec.gpu_uuids),
            thread_percentage=spec.thread_percentage,
            pinned_limits=",".join(f"{i}={limit}" for i, limit in spec.pinned_limits),
        )

    async def _adopt(self, spec: DaemonSpec) -> bool:
        """Whether a daemon already serves `spec` (another plugin's, told the same commands,
        and answering): then it is kept for its clients."""
        assert self.control is not None
        mark = read_owner(spec)
        if mark is None or mark.get("commands") != list(spec.commands()):
            return False
        return await self.control.healthy(spec)

    async def _stop(self, name: str, keep: DaemonSpec | None) -> None:
        """Quit `name`'s daemon; its GPUs back to DEFAULT unless `keep` (its successor) or
        another daemon still runs on them. A daemon another plugin has taken over is left to
        it."""
        spec = self.running.pop(name)
        self.down.pop(name, None)
        mark = read_owner(spec)
        if mark is not None and mark.get("owner") != self.owner:
            log_event(logger, "mps.daemon_handed_over", resource=name)
            return
        _owner_path(spec).unlink(missing_ok=True)
        if self.control is not None:
            await self.control.quit(spec)
        still = {uuid for other in self.running.values() for uuid in other.gpu_uuids}
        still |= set(keep.gpu_uuids) if keep else set()
        for uuid in spec.gpu_uuids:
            if uuid not in still:
                try:
                    await self._set_compute_mode(uuid, COMPUTE_MODE_DEFAULT)
                except DevicePluginError as exc:
                    log_event(logger, "mps.compute_mode_failed", logging.WARNING, error=str(exc))
        log_event(logger, "mps.daemon_stopped", resource=name)

    def _mark_down(self, name: str, reason: str) -> None:
        if self.down.get(name) != reason:
            log_event(logger, "mps.daemon_down", logging.WARNING, resource=name, reason=reason)
        self.down[name] = reason
