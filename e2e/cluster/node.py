"""A real single-node Kubernetes cluster on this machine, with no systemd: `cluster up|down|status|
restart COMPONENT` (the `cluster` script next to this file runs it).

Every component is a plain background process started by `cluster`, its PID kept in
`run/pids/` and its output in `run/logs/`: etcd, kube-apiserver (TLS, RBAC, service-account keys
made here, resource.k8s.io v1 with v1beta1 and v1beta2 served too), kube-controller-manager,
kube-scheduler, containerd (CRI, cgroupfs, CDI on /etc/cdi and /var/run/cdi, images imported
from local archives) and the kubelet (a registered Node, cgroup v1 allowed). The binaries come
from `build.sh` (built from source, cached outside the clone).

This module is the node's lifecycle (`up`, `down`, `status`, `restart`, in the order they need);
each job it orders is a module beside it: `layout` (paths, names, addresses), `shell` (commands
and waits), `pki` (certificates, kubeconfigs), `processes` (components under the reaper, what
/proc shows of them), `components` (command lines and config files), `network` (the bridge and
its NAT rule) and `images` (archives into containerd).

Network: nothing leaves the machine. The control plane listens on 127.0.0.1; pods sit on the
bridge `dpe2e0` (10.217.0.0/24, no default route, no masquerading), which also carries the node's
address 10.217.0.1. The one Service pods use, `kubernetes` (10.0.0.1:443), is a single DNAT rule
from the bridge to the API server on 127.0.0.1:6443. There is no kube-proxy and no cluster DNS.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from e2e.cluster import network
from e2e.cluster.components import components, write_configs
from e2e.cluster.images import ensure_images, import_images
from e2e.cluster.kubernetes_version import BadInput, chosen, feature_gates
from e2e.cluster.layout import (
    CONTAINERD_SOCKET,
    ETCD_CLIENT,
    HERE,
    KUBELET_ROOT,
    NODE_NAME,
    PKI,
    REPO,
    RUN,
    RUNTIME_STATE,
    STATE,
)
from e2e.cluster.pki import api_get, make_pki
from e2e.cluster.processes import (
    REAPER,
    STOP_ORDER,
    Component,
    defunct,
    kill_leftovers,
    pid_of,
    start,
    stop,
)
from e2e.cluster.served import GATES_FILE, VERSION_FILE
from e2e.cluster.shell import ClusterError, log, run, wait_for

SIMULATED_NODE = Path("/var/lib/deviceplugin-sim")
SIMULATED_PRESET = "a100-80gb-x8-mixed"
# The dynamic-MIG node of manifests/overlays/simulated-node-dra-dynamic-mig: a root of its own.
DYNAMIC_PRESET = "a100-80gb-x8-dynamic"
# The host commands `cluster` runs (here and in the modules beside this one), by the Debian
# package that has them: the `node` group of e2e/host-packages.txt (tests/test_host_packages.py
# keeps the two in step).
HOST_COMMANDS = {
    "ip": "iproute2",
    "iptables": "iptables",
    "openssl": "openssl",
    "mount": "mount",
    "umount": "mount",
}
# `up` builds the node, runs it and makes its images: e2e/host-packages.txt's groups for each.
PACKAGE_GROUPS = ("build", "node", "images")


def ensure_host_packages() -> None:
    """What `up` needs on the host, installed before the long build rather than missed after it:
    the build's, the node's and the images' packages (e2e/host-packages.txt)."""
    script = REPO / "e2e" / "host-packages.sh"
    if subprocess.run([str(script), *PACKAGE_GROUPS]).returncode != 0:
        raise ClusterError(f"{script} could not provide the host packages (see above)")
    absent = [f"{cmd} ({pkg})" for cmd, pkg in HOST_COMMANDS.items() if not shutil.which(cmd)]
    if absent:
        raise ClusterError(f"host commands missing: {', '.join(absent)}")


def binaries(version: str) -> Path:
    """The cached build of one Kubernetes version (build.sh builds it once per version set)."""
    done = subprocess.run([str(HERE / "build.sh"), version], stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise ClusterError("build.sh failed (its output is above)")
    return Path(done.stdout.strip().splitlines()[-1])


def helm() -> None:
    """Helm at run/bin/helm, beside kubectl: e2e/helm/build.sh builds it once from its own
    go.mod (cached outside the clone) and links it there."""
    done = subprocess.run([str(REPO / "e2e" / "helm" / "build.sh")], stdout=subprocess.DEVNULL)
    if done.returncode != 0:
        raise ClusterError("e2e/helm/build.sh failed (its output is above)")


def prepare_host() -> None:
    """Shared mount propagation (no systemd does it here), the pod network, and the directories
    the components keep their state in."""
    run(["mount", "--make-rshared", "/"])
    network.prepare_network()
    for path in (STATE, RUNTIME_STATE, KUBELET_ROOT, Path("/var/run/cdi"), Path("/etc/cdi")):
        path.mkdir(parents=True, exist_ok=True)


def prepare_simulated_node() -> None:
    """The simulated GPU node's host files the overlays mount: a driver root of real character
    devices with the simulated libnvidia-ml.so.1 (`deviceplugin sim-root`, again for a root made
    before it carried the library or the marker that makes the daemons read its `proc/`), and
    `events.jsonl`, where tests append Xids: a relative link to the events file that library
    reads, so host and containers name the same file. The dynamic-MIG node gets a root of its
    own beside it (`dynamic-root`), so its MIG layout never touches the static scenarios'."""
    made = (
        "usr/lib/x86_64-linux-gnu/deviceplugin-sim-node.json",
        "etc/deviceplugin-sim/sim-root.json",
    )
    for name, preset in (("root", SIMULATED_PRESET), ("dynamic-root", DYNAMIC_PRESET)):
        root = SIMULATED_NODE / name
        if not all((root / path).is_file() for path in made):
            deviceplugin = REPO / ".venv" / "bin" / "deviceplugin"
            run([deviceplugin, "sim-root", preset, root])
    events = SIMULATED_NODE / "events.jsonl"
    target = Path("root/etc/deviceplugin-sim/events.jsonl")
    if not events.is_symlink() or events.readlink() != target:
        events.unlink(missing_ok=True)
        events.symlink_to(target)


def up(version: str, gates: dict[str, bool]) -> None:
    running = any(pid_of(name) for name in STOP_ORDER)
    before = VERSION_FILE.read_text().strip() if VERSION_FILE.exists() else None
    if running and before not in (None, version):
        raise ClusterError(f"a Kubernetes {before} cluster is running: `cluster down` it first")
    ensure_host_packages()
    bin_dir = binaries(version)
    helm()
    if not running:
        clean_host()  # a fresh start: nothing of an earlier cluster may linger
    ensure_images()
    RUN.mkdir(exist_ok=True)
    prepare_host()
    prepare_simulated_node()
    make_pki()
    write_configs(bin_dir, gates)
    VERSION_FILE.write_text(version + "\n")
    GATES_FILE.write_text(json.dumps(gates) + "\n")
    every = components(bin_dir, gates)
    start(every["etcd"])
    wait_for(
        "etcd",
        lambda: b"true" in urllib.request.urlopen(f"http://{ETCD_CLIENT}/health", timeout=2).read(),
        60,
        "etcd",
    )
    start(every["kube-apiserver"])
    wait_for("kube-apiserver", lambda: api_get("/readyz") == b"ok", 120, "kube-apiserver")
    start(every["kube-controller-manager"])
    start(every["kube-scheduler"])
    start(every["containerd"])
    wait_for("containerd", CONTAINERD_SOCKET.is_socket, 60, "containerd")
    import_images(bin_dir)
    start(every["kubelet"])
    publish_tools(bin_dir)
    wait_for("node Ready", node_ready, 180, "kubelet")
    # Pods are refused until the controller manager has made the namespace's service account.
    wait_for(
        "service account default/default",
        lambda: bool(api_get("/api/v1/namespaces/default/serviceaccounts/default")),
        60,
        "kube-controller-manager",
    )
    kubectl = RUN / "bin" / "kubectl"
    log(f"up: Kubernetes {version}, {NODE_NAME} Ready; KUBECONFIG={RUN / 'kubeconfig'} {kubectl}")


def publish_tools(bin_dir: Path) -> None:
    shutil.copyfile(RUN / "admin.kubeconfig", RUN / "kubeconfig")
    (RUN / "bin").mkdir(exist_ok=True)
    for tool in ("kubectl", "crictl", "ctr"):
        link = RUN / "bin" / tool
        link.unlink(missing_ok=True)
        link.symlink_to(bin_dir / tool)
    (RUN / "crictl.yaml").write_text(
        f"runtime-endpoint: unix://{CONTAINERD_SOCKET}\n"
        f"image-endpoint: unix://{CONTAINERD_SOCKET}\n"
    )


def node_ready() -> bool:
    node = json.loads(api_get(f"/api/v1/nodes/{NODE_NAME}"))
    return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])


def restart(name: str) -> None:
    saved = RUN / "cmdline" / name
    if not saved.exists():
        raise ClusterError(f"{name} was never started here (no {saved})")
    stop(name)
    start(Component(name, tuple(saved.read_text().split("\0"))))
    if name == "kubelet":
        healthz = "http://127.0.0.1:10248/healthz"
        wait_for(
            "kubelet healthz",
            lambda: urllib.request.urlopen(healthz, timeout=2).read() == b"ok",
            120,
            "kubelet",
        )
        wait_for("node Ready", node_ready, 180, "kubelet")


def down() -> None:
    """Stops every pod, then every component, and removes what `up` put on the host: mounts
    under the cluster's directories, the pods' network namespaces, the bridge and its NAT rule."""
    stop("kubelet")
    crictl = RUN / "bin" / "crictl"
    if pid_of("containerd") and crictl.exists():
        env_args = ["--config", str(RUN / "crictl.yaml"), "--timeout", "30s"]
        for pod in run([crictl, *env_args, "pods", "-q"], check=False).split():
            run([crictl, *env_args, "stopp", pod], check=False)
            run([crictl, *env_args, "rmp", "-f", pod], check=False)
    for name in STOP_ORDER:
        stop(name)
    clean_host()
    stop(REAPER)
    left = defunct()
    log(f"down: every component stopped, host cleaned; defunct processes left: {len(left)}")
    for line in left:
        log(f"  {line}")


def clean_host() -> None:
    """Ends whatever a cluster left (also one whose processes were killed rather than stopped,
    which `up` finds when none of its own PIDs is alive) and removes its traces on the host."""
    kill_leftovers()
    unmount_under((KUBELET_ROOT, STATE, RUNTIME_STATE))
    network.remove_network()
    # The next `up` starts from an empty cluster; built binaries and imported images stay.
    for path in (STATE / "etcd", STATE / "cni", KUBELET_ROOT, RUNTIME_STATE, PKI, SIMULATED_NODE):
        shutil.rmtree(path, ignore_errors=True)


def unmount_under(roots: Sequence[Path]) -> None:
    prefixes = tuple(str(root) + "/" for root in roots) + tuple(str(root) for root in roots)
    mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    for target in sorted((m for m in mounts if m.startswith(prefixes)), key=len, reverse=True):
        run(["umount", "-l", target], check=False, quiet=True)


def status() -> int:
    down_count = 0
    for name in reversed(STOP_ORDER):
        pid = pid_of(name)
        down_count += pid is None
        print(f"{name:24} {'running, pid ' + str(pid) if pid else 'stopped'}")
    try:
        node = json.loads(api_get(f"/api/v1/nodes/{NODE_NAME}"))
        ready = [c["status"] for c in node["status"]["conditions"] if c["type"] == "Ready"]
        print(f"node {NODE_NAME}: Ready={ready[0] if ready else '?'}")
        for resource, count in sorted(node["status"]["allocatable"].items()):
            print(f"  allocatable {resource}: {count}")
    except (OSError, ValueError, KeyError) as exc:
        print(f"node {NODE_NAME}: API not reachable ({exc})")
        down_count += 1
    reaper = pid_of(REAPER)
    print(f"{REAPER:24} {'running, pid ' + str(reaper) if reaper else 'stopped'}")
    left = defunct()
    print(f"defunct processes under the cluster: {len(left)}")
    for line in left:
        print(f"  {line}")
    return 0 if down_count == 0 else 3


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cluster", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser(
        "up",
        help="build if needed, start everything, wait for the node to be Ready; the version is"
        " KUBERNETES_VERSION (a pinned minor, default the newest), FEATURE_GATES=A=true,B=false"
        " optional (otherwise the version's defaults)",
    )
    commands.add_parser("down", help="stop everything and clean the host")
    commands.add_parser("status", help="each component, the node and its allocatable")
    restart_parser = commands.add_parser("restart", help="stop and start one component")
    restart_parser.add_argument("component", choices=STOP_ORDER)
    args = parser.parse_args(argv)
    if args.command == "up":  # bad input is refused before anything is checked or done
        try:
            version, gates = chosen(os.environ), feature_gates(os.environ)
        except BadInput as exc:
            print(f"cluster: {exc}", file=sys.stderr)
            return 2
    if os.geteuid() != 0:
        if args.command == "up":  # name the missing packages too, so one sudo session does it
            subprocess.run([str(REPO / "e2e" / "host-packages.sh"), "--check", *PACKAGE_GROUPS])
        print("cluster: needs root (mounts, network, containerd, the kubelet)", file=sys.stderr)
        return 2
    try:
        if args.command == "up":
            up(version, gates)
        elif args.command == "down":
            down()
        elif args.command == "restart":
            restart(args.component)
        else:
            return status()
    except ClusterError as exc:
        print(f"cluster: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
