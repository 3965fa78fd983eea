"""An MPS claim prepared by NVIDIA's DRA driver (gpu-kubelet-plugin v0.4.1 with
`--feature-gates=MPSSupport=true`, unmodified) and by ours, one after the other on the same real
node (docs/compatibility.md, "MPS claims").

The claim asks for one whole GPU, pinned by its UUID, with NVIDIA's opaque GpuConfig sharing it
through MPS (50 % of the threads, 10 GiB pinned), and a pod of our image holds it. NVIDIA's
Prepare creates a control-daemon Deployment from its own template, which the real controller
manager and kubelet run (on our image, with the simulated `nvidia-cuda-mps-control` of the
driver root); ours runs the daemon itself. NVIDIA's driver runs as a host process, as in
test_reference_dra.py, with its template bound at the path its image has it.

Compared: what the container sees (its `CUDA_MPS_*` variables, the daemon's socket through the
pipe, the pipe and /dev/shm mounts), the limits a client there gets (the daemon's defaults
unless its variables override them), the commands the simulated control daemon received and
the limits it holds, the GPU's compute mode while the claim is prepared and after, and that no
daemon is left. What differs is documented and pinned here.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from e2e.cluster.kube import (
    KUBECONFIG,
    NODE_NAME,
    RUN,
    Obj,
    apply,
    exec_in,
    get,
    kubectl,
    wait_until,
)
from e2e.cluster.simlibrary import compute_mode, set_compute_mode
from e2e.cluster.test_dra import CDI_DIR, DRIVER, DRIVER_ROOT, claim_uid, published, start
from e2e.cluster.test_dra_shares import (
    DEFAULT,
    EXCLUSIVE_PROCESS,
    GPU,
    IMAGE,
    MPS_HOMES,
    share_pod,
    template,
)
from e2e.cluster.test_reference_dra import (
    CLASSES,
    DEVICES,
    no_slices,
    nvidia_binaries,
    with_ours,
)
from testbed import plugins

TEMPLATE = "reference-mps-gpu"
POD = "reference-mps"
LABEL = "reference-mps"  # the pod's `e2e` label
MPS_CONFIG = {"defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "10Gi"}
# What a client in the container gets from either: 50 % and 10 GiB pinned on the claim's GPU.
CLIENT_LIMITS = {"activeThreadPercentage": 50.0, "pinnedMiB": {GPU.uuid: 10240}}
SNAPSHOT = RUN / "reference-dra-mps.json"

# What the claim's container sees: its MPS variables, whether the pipe directory they name
# holds the daemon's socket, and the mounts at that directory and at /dev/shm (file system
# type, mount options, and the host folder each shows: mountinfo's root).
PROBE = """
import json, os, stat
pipe = os.environ.get('CUDA_MPS_PIPE_DIRECTORY', '')
socket = os.path.join(pipe, 'control')
mounts = {}
for line in open('/proc/self/mountinfo'):
    left, right = line.split(' - ')
    fields, kind = left.split(), right.split()[0]
    if fields[4] in (pipe, '/dev/shm'):
        options = sorted(fields[5].split(','))
        mounts[fields[4]] = {'type': kind, 'options': options, 'root': fields[3]}
print(json.dumps({
    'env': {k: v for k, v in os.environ.items() if k.startswith('CUDA_MPS_')},
    'socket': os.path.exists(socket) and stat.S_ISSOCK(os.stat(socket).st_mode),
    'mounts': mounts,
}))
"""
COMMAND = re.compile(r"Cmd:(.*)$")


@dataclass
class MpsRun:
    """What one driver did for the claim."""

    uid: str = ""
    seen: Obj = field(default_factory=dict)  # PROBE's answer in the container
    device: str = ""  # the name the driver publishes the claim's GPU under
    home: str = ""  # the daemon's folder under MPS_HOMES
    commands: list[str] = field(default_factory=list)  # what the control daemon received
    held: Obj = field(default_factory=dict)  # the limits file the simulated daemon keeps
    deployments: list[str] = field(default_factory=list)  # in the namespace, while prepared
    new_daemons: int = 0  # control daemons on the host while prepared, beyond those before
    mode_prepared: int = -1
    mode_after: int = -1
    daemons_left: int = 0
    home_left: bool = True


def mps_daemons() -> set[int]:
    """The host pids of every MPS control daemon (`nvidia-cuda-mps-control -d`), from /proc."""
    found = set()
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # not a process, or one that exited
        if argv[0].endswith(b"nvidia-cuda-mps-control") and b"-d" in argv[1:]:
            found.add(int(proc.name))
    return found


def homes() -> list[str]:
    return sorted(p.name for p in MPS_HOMES.iterdir()) if MPS_HOMES.is_dir() else []


def mps_deployments() -> list[str]:
    items = get("deployments", "-n", "default")["items"]
    return sorted(
        d["metadata"]["name"]
        for d in items
        if d["metadata"]["name"].startswith("mps-control-daemon-")
    )


def _drive() -> MpsRun:
    """Run the workload on whichever driver is serving, read everything, then delete it and
    read what is left."""
    devices = {str(d["attributes"]["uuid"]["string"]): name for name, d in published().items()}
    run = MpsRun(device=devices[GPU.uuid])
    before = mps_daemons()
    start(share_pod(POD, TEMPLATE, LABEL))
    run.uid = claim_uid(POD)
    run.seen = json.loads(exec_in(POD, "python", "-c", PROBE))
    (run.home,) = homes()
    home = MPS_HOMES / run.home
    log = (home / "log" / "control.log").read_text()
    run.commands = [m.group(1) for m in map(COMMAND.search, log.splitlines()) if m]
    run.held = json.loads((home / "pipe" / "deviceplugin-sim-mps.json").read_text())
    run.deployments = mps_deployments()
    run.new_daemons = len(mps_daemons() - before)
    run.mode_prepared = compute_mode(DRIVER_ROOT, GPU.uuid)

    kubectl("delete", "pod", "-n", "default", POD, "--wait=true", "--timeout=120s")
    wait_until("the claim unprepared", lambda: not list(CDI_DIR.glob(f"*{run.uid}*")) or None)
    # NVIDIA's daemon goes with its Deployment's pod, deleted by Unprepare.
    wait_until("the control daemon gone", lambda: not (mps_daemons() - before) or None, 120)
    wait_until("no daemon Deployment", lambda: not mps_deployments() or None, 120)
    run.daemons_left = len(mps_daemons() - before)
    run.home_left = (MPS_HOMES / run.home).exists()
    run.mode_after = compute_mode(DRIVER_ROOT, GPU.uuid)
    return run


def _drive_and_clean() -> MpsRun:
    """`_drive`, and on a failure its pod deleted while the driver can still unprepare it."""
    try:
        return _drive()
    finally:
        selector = ("-l", f"e2e={LABEL}", "--wait=true", "--timeout=120s")
        kubectl("delete", "pod", "-n", "default", *selector, check=False)


@pytest.fixture(scope="module")
def runs() -> Iterator[dict[str, MpsRun]]:
    binaries = nvidia_binaries()
    kubectl("apply", "-f", str(CLASSES))
    apply(template(TEMPLATE, None, MPS_CONFIG, device_class="gpu.nvidia.com"))
    driven: dict[str, MpsRun] = {}
    wait_until("no slices of another driver", no_slices, timeout=120)
    plugins.hand_over_dra_checkpoint()
    made_mountpoint = not plugins.MPS_TEMPLATES_AT.exists()
    plugins.MPS_TEMPLATES_AT.mkdir(exist_ok=True)
    log = RUN / "logs" / "nvidia-dra-driver-mps.log"
    driver = plugins.dra_driver(
        binaries,
        DRIVER_ROOT,
        KUBECONFIG,
        NODE_NAME,
        CDI_DIR,
        log,
        flags=["--feature-gates=MPSSupport=true"],
        # Our image, for its `sh`, `tail` and `cat`: a tag the kubelet does not pull, as
        # NVIDIA's Deployment names no pull policy.
        image=IMAGE,
        templates=plugins.dra_templates(binaries),
        bidirectional=MPS_HOMES,
    )
    try:
        with plugins.shared_mount(MPS_HOMES), driver.start():
            wait_until("NVIDIA's slices", lambda: len(published()) == DEVICES or None, 120)
            driven["nvidia"] = _drive_and_clean()
    finally:
        if made_mountpoint:
            plugins.MPS_TEMPLATES_AT.rmdir()
    # NVIDIA's driver leaves the GPU in EXCLUSIVE_PROCESS (asserted below): as before it ran.
    set_compute_mode(DRIVER_ROOT, GPU.uuid, DEFAULT)
    driven["ours"] = with_ours(_drive_and_clean)
    SNAPSHOT.write_text(json.dumps({k: v.__dict__ for k, v in driven.items()}, indent=1) + "\n")
    yield driven


def client_limits(run: MpsRun) -> Obj:
    """The limits a client in the container gets: the daemon's defaults, overridden by the
    container's `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` and `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`
    (`<device>=<limit>` pairs). The claim holds one GPU, index 0 in the container: both keys
    name GPU.uuid."""
    env = run.seen["env"]
    percentage = env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", run.held["activeThreadPercentage"])
    pinned = dict(run.held["pinnedDeviceMemoryLimitMiB"])
    for pair in filter(None, env.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "").split(",")):
        device, limit = pair.split("=")
        pinned[device] = int(limit[:-1]) << (10 if limit.endswith("G") else 0)
    by_uuid = {GPU.uuid if key == "0" else key: mib for key, mib in pinned.items()}
    return {"activeThreadPercentage": float(percentage), "pinnedMiB": by_uuid}


def test_both_give_the_container_the_pipe_and_the_shm(runs: dict[str, MpsRun]) -> None:
    for name, run in runs.items():
        seen = run.seen
        assert seen["env"]["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps", (name, seen)
        assert seen["socket"], (name, seen)
        pipe, shm = seen["mounts"]["/tmp/nvidia-mps"], seen["mounts"]["/dev/shm"]
        # Each bound from the daemon's own folder on the host, as the CDI edits say.
        assert pipe["root"].endswith(f"/{DRIVER}/mps/{run.home}/pipe"), (name, pipe)
        assert {"rw", "nosuid", "nodev"} <= set(pipe["options"]) & set(shm["options"]), name
    nvidia, ours = runs["nvidia"].seen["mounts"], runs["ours"].seen["mounts"]
    assert nvidia["/tmp/nvidia-mps"]["options"] == ours["/tmp/nvidia-mps"]["options"]


def test_only_nvidias_shm_is_a_tmpfs(runs: dict[str, MpsRun]) -> None:
    """Documented: NVIDIA's driver mounts a tmpfs on the daemon's shm folder, which reaches the
    host through its privileged DaemonSet's Bidirectional mount; our DaemonSet is not
    privileged, so the folder stays a directory of the host's file system."""
    nvidia, ours = runs["nvidia"], runs["ours"]
    assert nvidia.seen["mounts"]["/dev/shm"]["type"] == "tmpfs", nvidia.seen
    shm = ours.seen["mounts"]["/dev/shm"]
    assert shm["type"] != "tmpfs" and shm["root"].endswith(f"/mps/{ours.home}/shm"), shm


def test_a_client_gets_the_same_limits_from_either(runs: dict[str, MpsRun]) -> None:
    assert client_limits(runs["nvidia"]) == client_limits(runs["ours"]) == CLIENT_LIMITS


def test_nvidia_tells_the_daemon_and_ours_tells_the_client(runs: dict[str, MpsRun]) -> None:
    """Documented: NVIDIA's daemon serves one claim, so the limits are its defaults; ours
    serves every claim on the GPU, so each claim's limits go in its containers' variables."""
    nvidia, ours = runs["nvidia"], runs["ours"]
    assert nvidia.commands == [
        "set_default_active_thread_percentage 50",
        f"set_default_device_pinned_mem_limit {GPU.uuid} 10240M",
    ]
    assert nvidia.held["activeThreadPercentage"] == 50.0
    assert nvidia.held["pinnedDeviceMemoryLimitMiB"] == {GPU.uuid: 10240}
    assert set(nvidia.seen["env"]) == {"CUDA_MPS_PIPE_DIRECTORY"}
    told = [c for c in ours.commands if c.startswith("set_default")]
    assert told == ["set_default_active_thread_percentage 100"], ours.commands
    assert ours.held["activeThreadPercentage"] == 100.0
    assert ours.held["pinnedDeviceMemoryLimitMiB"] == {}
    assert ours.seen["env"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert ours.seen["env"]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10240M"


def test_one_daemon_named_per_claim_or_per_device(runs: dict[str, MpsRun]) -> None:
    nvidia, ours = runs["nvidia"], runs["ours"]
    assert nvidia.new_daemons == ours.new_daemons == 1
    digest = hashlib.sha256(GPU.uuid.encode()).hexdigest()[:5]
    assert nvidia.home == f"{nvidia.uid}-{digest}"
    assert nvidia.deployments == [f"mps-control-daemon-{nvidia.home}"]
    assert ours.home == ours.device and ours.deployments == []


def test_no_daemon_left_after_unprepare(runs: dict[str, MpsRun]) -> None:
    for name, run in runs.items():
        assert run.daemons_left == 0 and not run.home_left, name


def test_exclusive_process_while_prepared_and_only_ours_restores_it(
    runs: dict[str, MpsRun],
) -> None:
    """Documented: NVIDIA's Unprepare stops the daemon and leaves the compute mode it set."""
    nvidia, ours = runs["nvidia"], runs["ours"]
    assert nvidia.mode_prepared == ours.mode_prepared == EXCLUSIVE_PROCESS
    assert nvidia.mode_after == EXCLUSIVE_PROCESS
    assert ours.mode_after == DEFAULT
