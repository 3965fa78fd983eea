"""The two device plugins as processes on one simulated driver root: NVIDIA's reference plugin
(built by build.sh) and ours, each started the way a node runs it, against our kubelet emulator.

The reference always puts its sockets in /var/lib/kubelet/device-plugins, reads
/proc/driver/nvidia-caps from the host's /proc, NUMA affinity from /sys/bus/pci/devices and
looks for the control device nodes in /dev, and with a CDI strategy writes its spec to
/var/run/cdi. So it runs in a mount namespace of its own (root), where a bind mount puts the
emulator's directory at that path and tmpfs and bind mounts give it the driver root's
/proc/driver, /dev nodes and sysfs, and an empty /var/run/cdi: the host sees none of it. Ours
takes the driver root, the kubelet directory and the CDI directory as flags. With MPS, NVIDIA's
`mps-control-daemon` runs the same way beside it (`reference_mps_daemon`), both seeing the
config's mpsRoot at their fixed /mps.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from testbed.process import Child

REPO = Path(__file__).resolve().parent.parent
# Beside the pinned Go modules of NVIDIA's components it builds, with the compatibility tests.
BUILD = REPO / "e2e" / "reference" / "build.sh"
KUBELET_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
REFERENCE_EXECUTABLE = "nvidia-device-plugin"
# What either plugin reads from the environment; neither may see the caller's.
PLUGIN_ENV_PREFIXES = ("NVIDIA_", "CONTAINER_DRIVER_ROOT", "DP_", "MIG_", "CONFIG_FILE")
PLUGIN_ENV_NAMES = (
    "FAIL_ON_INIT_ERROR",
    "PASS_DEVICE_SPECS",
    "DEVICE_LIST_STRATEGY",
    "DEVICE_ID_STRATEGY",
    "CDI_ANNOTATION_PREFIX",
    "DEVICE_DISCOVERY_STRATEGY",
    "KUBELET_SOCKET",
    "MPS_ROOT",
)


class ReferenceUnavailable(Exception):
    """The reference cannot be built or run here (no Go, no gcc, not root)."""


def reference_binaries() -> Path:
    """The folder holding NVIDIA's binaries, built (or found in the cache) by build.sh."""
    if shutil.which("go") is None:
        raise ReferenceUnavailable("Go is not installed: build.sh needs it to build the reference")
    done = subprocess.run(
        [str(BUILD)], capture_output=True, text=True, check=False, env=_build_env()
    )
    if done.returncode != 0:
        raise ReferenceUnavailable(f"build.sh failed:\n{done.stderr[-2000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def _build_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("GOTOOLCHAIN", "auto")
    return env


def require_root() -> None:
    if os.geteuid() != 0:
        raise ReferenceUnavailable("the reference plugin runs in a mount namespace: needs root")


def runnable_binaries() -> Path:
    """NVIDIA's binaries, when this process may run them as the comparisons do (root); raises
    ReferenceUnavailable saying why not."""
    require_root()
    return reference_binaries()


def sim_root(preset: str, directory: Path) -> Path:
    """`deviceplugin sim-root PRESET DIR`: a driver root with the simulated NVML library."""
    done = subprocess.run(
        [sys.executable, "-m", "deviceplugin", "sim-root", preset, str(directory)],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
    )
    if done.returncode != 0:
        raise RuntimeError(f"sim-root {preset}: {done.stderr.strip()}")
    return directory


def plugin_env() -> dict[str, str]:
    """The caller's environment without anything either plugin would read as a setting."""
    return {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(PLUGIN_ENV_PREFIXES) and key not in PLUGIN_ENV_NAMES
    }


def running(pid: int, executable: str, proc: Path = Path("/proc")) -> int:
    """The process that runs `executable` (a file name): `pid` itself once it has exec'd it, or
    its nearest descendant that has (`unshare` may fork, `sh` forks unless the script execs).
    Read from /proc/<pid>/exe and /proc/<pid>/task/*/children; LookupError if none does."""
    queue = [pid]
    while queue:
        current = queue.pop(0)
        with contextlib.suppress(OSError):
            if Path(os.readlink(proc / str(current) / "exe")).name == executable:
                return current
        for children in sorted((proc / str(current) / "task").glob("*/children")):
            with contextlib.suppress(OSError):
                queue += [int(child) for child in children.read_text().split()]
    raise LookupError(f"no process under {pid} runs {executable}")


def reference_pid(plugin: Child) -> int:
    """The pid of NVIDIA's Go process itself, under the `unshare ... sh -c` that starts it."""
    return running(plugin.pid, REFERENCE_EXECUTABLE)


def reference(
    binaries: Path,
    root: Path,
    kubelet_dir: Path,
    config: Path,
    log: Path,
    mps_root: Path | None = None,
) -> Child:
    """NVIDIA's plugin on driver root `root`, registering with `kubelet_dir/kubelet.sock`; with
    `mps_root`, as it runs beside its MPS control daemon (`reference_mps_daemon`)."""
    script = "\n".join(
        [
            "set -e",
            "mount --make-rprivate /",
            *_mps_mounts(mps_root),
            f"mkdir -p {KUBELET_PLUGIN_DIR} /var/run/cdi",
            f'mount --bind "$KUBELET_DIR" {KUBELET_PLUGIN_DIR}',
            "mount -t tmpfs -o mode=0755 compat-driver /proc/driver",
            'cp -r "$DRIVER_ROOT/proc/driver/." /proc/driver/',
            "mount -t tmpfs -o mode=0755 compat-cdi /var/run/cdi",
            # A GPU node's /dev (the reference looks for the control nodes there) and its PCI
            # functions' NUMA affinity (read from /sys): the driver root's.
            'mkdir -p "$WORK/dev"',
            'cp -a /dev/null /dev/zero /dev/full /dev/random /dev/urandom "$WORK/dev/"',
            'find "$DRIVER_ROOT/dev" -maxdepth 1 -name "nvidia*" ! -type d'
            ' -exec cp -a -t "$WORK/dev/" {} +',
            "mount -t tmpfs -o mode=0755 compat-dev /dev",
            'cp -a "$WORK/dev/." /dev/',
            'mount --bind "$DRIVER_ROOT/sys/bus/pci/devices" /sys/bus/pci/devices',
            'exec "$PLUGIN" --config-file "$CONFIG" --kubelet-socket "$KUBELET_DIR/kubelet.sock"',
        ]
    )
    env = plugin_env() | {
        "PLUGIN": str(binaries / REFERENCE_EXECUTABLE),
        "DRIVER_ROOT": str(root),
        "KUBELET_DIR": str(kubelet_dir),
        "CONFIG": str(config),
        "WORK": str(log.parent),
        "NVIDIA_DRIVER_ROOT": str(root),
        "CONTAINER_DRIVER_ROOT": str(root),
    }
    if mps_root is not None:
        env |= _mps_env(root, mps_root)
    argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script]
    return Child(argv, log, env)


# NVIDIA's MPS daemon keeps its files under this fixed path (cmd/mps-control-daemon/mps/root.go);
# its chart mounts `mps.root` there, in the daemon's container and the plugin's.
REFERENCE_MPS_ROOT = "/mps"
MPS_DAEMON_EXECUTABLE = "mps-control-daemon"
MPS_READY = ".ready"  # written by NVIDIA's daemon once every control daemon has its limits


def _mps_mounts(mps_root: Path | None) -> list[str]:
    if mps_root is None:
        return []
    return [f"mkdir -p {REFERENCE_MPS_ROOT}", f'mount --bind "$MPS_HOST_DIR" {REFERENCE_MPS_ROOT}']


def _mps_env(root: Path, mps_root: Path) -> dict[str, str]:
    """What NVIDIA's container runtime gives its MPS containers: the driver's programs on PATH
    (`nvidia-cuda-mps-control`, `nvidia-smi`) and its libraries where the loader finds them
    (its daemon loads `libnvidia-ml.so.1` by soname)."""
    return {
        "MPS_HOST_DIR": str(mps_root),  # not MPS_ROOT: the plugin reads that as --mps-root
        "PATH": f"{root / 'usr/bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "LD_LIBRARY_PATH": str(root / "usr/lib/x86_64-linux-gnu"),
    }


def reference_mps_daemon(
    binaries: Path, root: Path, config: Path, mps_root: Path, log: Path
) -> Child:
    """NVIDIA's `mps-control-daemon` on driver root `root` with `config`, its `/mps` the host's
    `mps_root` (a private mount namespace: it writes there whatever its flags say). It starts
    one control daemon per MPS-shared resource through the driver root's
    `nvidia-cuda-mps-control` (compute modes set with the driver root's `nvidia-smi`), and
    writes `mps_root/.ready` once all have their limits. Its fixed `/mps` must exist as a
    mount point: an empty folder is left on the host, as /var/run/cdi is by `reference`."""
    script = "\n".join(
        [
            "set -e",
            "mount --make-rprivate /",
            *_mps_mounts(mps_root),
            'exec "$DAEMON" --config-file "$CONFIG"',
        ]
    )
    env = (
        plugin_env()
        | _mps_env(root, mps_root)
        | {
            "DAEMON": str(binaries / MPS_DAEMON_EXECUTABLE),
            "CONFIG": str(config),
        }
    )
    argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script]
    return Child(argv, log, env)


def ours(
    root: Path,
    kubelet_dir: Path,
    config: Path,
    cdi_dir: Path,
    log: Path,
    extra: Sequence[str] = (),
) -> Child:
    """`deviceplugin serve` on the same driver root, with the same config file (and `extra`
    flags)."""
    argv = [*_deviceplugin(), "serve", "--config-file", str(config)]
    argv += ["--kubelet-dir", str(kubelet_dir)]
    argv += ["--nvidia-driver-root", str(root), "--cdi-spec-dir", str(cdi_dir), *extra]
    return Child(argv, log, plugin_env())


def ours_dra(
    root: Path,
    kubeconfig: Path,
    node_name: str,
    cdi_dir: Path,
    kubelet_root: Path,
    log: Path,
    extra: Sequence[str] = (),
) -> Child:
    """`deviceplugin dra serve` on driver root `root`, for node `node_name` of the cluster in
    `kubeconfig`, registering with the kubelet whose root is `kubelet_root` (and `extra`
    flags)."""
    argv = [*_deviceplugin(), "dra", "serve", "--nvidia-driver-root", str(root)]
    argv += ["--kubeconfig", str(kubeconfig), "--node-name", node_name]
    argv += ["--kubelet-root", str(kubelet_root), "--cdi-spec-dir", str(cdi_dir), *extra]
    return Child(argv, log, plugin_env())


def write_kubeconfig(path: Path, url: str) -> Path:
    """A kubeconfig for the API-server stand-in at `url` (its token is not checked)."""
    cluster = {"name": "stand-in", "cluster": {"server": url}}
    context = {"name": "here", "context": {"cluster": "stand-in", "user": "driver"}}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [cluster],
        "users": [{"name": "driver", "user": {"token": "not-checked"}}],
        "contexts": [context],
        "current-context": "here",
    }
    path.write_text(json.dumps(config))
    return path


def _deviceplugin() -> list[str]:
    """The installed console script, or the package run as a module when there is none."""
    console = Path(sys.executable).parent / "deviceplugin"
    return [str(console)] if console.exists() else [sys.executable, "-m", "deviceplugin"]


DRA_PLUGIN_DIR = Path("/var/lib/kubelet/plugins/gpu.nvidia.com")
DRA_EXECUTABLE = "gpu-kubelet-plugin"
# Where NVIDIA's DRA driver reads its templates (a constant in its code, its image's folder).
MPS_TEMPLATES_AT = Path("/templates")


def dra_templates(binaries: Path) -> Path:
    """NVIDIA's DRA driver's pod templates, put beside its binaries by build.sh."""
    return binaries.parent / "templates"


def hand_over_dra_checkpoint(plugin_dir: Path = DRA_PLUGIN_DIR) -> None:
    """Both drivers are `gpu.nvidia.com` and keep `checkpoint.json` in the same folder, each in
    its own format: NVIDIA's refuses to start on ours ("cannot unmarshal string into ...
    Checkpoint.checksum"). Ours, with no claim prepared, is removed so that NVIDIA's starts
    clean (docs/compatibility.md, "DRA"); one that still lists claims is an error."""
    path = plugin_dir / "checkpoint.json"
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        return
    except ValueError as err:
        raise RuntimeError(f"{path}: not JSON: {err}") from err
    if "version" not in document:
        return  # NVIDIA's own
    if document.get("data", {}).get("claims"):
        raise RuntimeError(f"{path} still lists prepared claims: unprepare them first")
    path.unlink()


def dra_driver(
    binaries: Path,
    root: Path,
    kubeconfig: Path,
    node_name: str,
    cdi_dir: Path,
    log: Path,
    kubelet_root: Path | None = None,
    flags: Sequence[str] = (),
    image: str = "unused:none",
    templates: Path | None = None,
    bidirectional: Path | None = None,
) -> Child:
    """NVIDIA's DRA kubelet plugin on driver root `root`, for node `node_name` of the cluster in
    `kubeconfig`, registering with the real kubelet (/var/lib/kubelet/plugins_registry), or
    with the one whose root is `kubelet_root` (its plugins_registry and plugins folders, as
    `dra serve --kubelet-root` uses them), with `flags` added (`--feature-gates=...`). It
    reads /proc/driver/nvidia/capabilities and the nvidia-caps major in /proc/devices from the
    host's /proc: a private mount namespace shows it the driver root's, bound, so the
    capability files of MIG instances cut later appear too.

    `image` is what its pods' templates name (an MPS claim's control-daemon Deployment runs
    it); `templates`, a folder holding NVIDIA's `mps-control-daemon.tmpl.yaml`, is bound at
    the fixed path its image has them at, /templates, which must exist (MPS_TEMPLATES_AT).
    `bidirectional`, a mount shared with the host (`shared_mount`), stays shared in the
    driver's namespace, as its DaemonSet's Bidirectional mount of the plugin folder does: what
    it mounts there (an MPS claim's shm tmpfs) reaches the host and the containers. Only the
    root and /proc are made private then; everything else keeps the host's propagation."""
    bind_templates = ['mount --bind "$TEMPLATES" ' + str(MPS_TEMPLATES_AT)] if templates else []
    private = ["mount --make-private /", "mount --make-rprivate /proc"]
    script = "\n".join(
        [
            "set -e",
            *(private if bidirectional else ["mount --make-rprivate /"]),
            # Bound, not copied: the simulated library adds a MIG instance's capability
            # files there as it cuts one, as the kernel module does under /proc.
            'mount --bind "$DRIVER_ROOT/proc/driver" /proc/driver',
            'mount --bind "$DRIVER_ROOT/proc/devices" /proc/devices',
            *bind_templates,
            'exec "$PLUGIN" --node-name "$NODE_NAME" --kubeconfig "$KUBECONFIG"'
            ' --nvidia-driver-root "$DRIVER_ROOT" --container-driver-root "$DRIVER_ROOT"'
            ' --cdi-root "$CDI_ROOT" --nvidia-cdi-hook-path "$HOOK" --image-name "$IMAGE"'
            ' "$@"',
        ]
    )
    extra = list(flags)
    if kubelet_root is not None:
        extra += ["--kubelet-registrar-directory-path", str(kubelet_root / "plugins_registry")]
        extra += ["--kubelet-plugins-directory-path", str(kubelet_root / "plugins")]
    env = plugin_env() | {
        "PLUGIN": str(binaries / DRA_EXECUTABLE),
        "HOOK": str(binaries / "nvidia-cdi-hook"),
        "DRIVER_ROOT": str(root),
        "NODE_NAME": node_name,
        "KUBECONFIG": str(kubeconfig),
        "CDI_ROOT": str(cdi_dir),
        "IMAGE": image,
        "TEMPLATES": str(templates or ""),
    }
    propagation = "unchanged" if bidirectional else "private"
    argv = ["unshare", "--mount", "--propagation", propagation, "sh", "-c", script, "sh", *extra]
    return Child(argv, log, env)


@contextlib.contextmanager
def shared_mount(path: Path) -> Iterator[Path]:
    """`path` bound on itself and made shared on the host while the block runs, so that a
    driver given it as `bidirectional` mounts there for the host to see; unmounted after, with
    whatever is still mounted under it."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "--bind", str(path), str(path)], check=True)
    try:
        subprocess.run(["mount", "--make-shared", str(path)], check=True)
        yield path
    finally:
        subprocess.run(["umount", "--recursive", str(path)], check=True)
