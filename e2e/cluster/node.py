"""A real Kubernetes cluster of one node (or two, `NODES=2`) on this machine, with no systemd:
`cluster up|down|status|restart COMPONENT|exec NODE -- COMMAND` (the `cluster` script next to this
file runs it).

Every component is a plain background process started by `cluster`, its PID kept in
`run/pids/` and its output in `run/logs/`: etcd, kube-apiserver (TLS, RBAC, service-account keys
made here, resource.k8s.io v1 with v1beta1 and v1beta2 served too), kube-controller-manager,
kube-scheduler, containerd (CRI, cgroupfs, CDI on /etc/cdi and /var/run/cdi, images imported
from local archives) and the kubelet (a registered Node, cgroup v1 allowed). The binaries come
from `build.sh` (built from source, cached outside the clone).

This module is the cluster's lifecycle (`up`, `down`, `status`, `restart`, `exec`, in the order
they need); each job it orders is a module beside it: `layout` (paths, names, addresses, each
node's own), `topology` (how many nodes), `shell` (commands and waits), `pki` (certificates,
kubeconfigs), `processes` (components under the reaper, what /proc shows of them), `components`
(command lines and config files), `network` (the bridges and the NAT rule), `cgroups` (a second
node's cgroup root), `mountns` (a second node's mount namespace) and `images` (archives into
each containerd).

A second node (`NODES=2`, docs/cluster.md "Two nodes") joins the same control plane with its own
kubelet and containerd, both run in a mount namespace of its own that shows its own folders at
the host paths a node uses, its own bridge, pod range, ports, certificate and cgroup root.

Network: nothing leaves the machine. The control plane listens on 127.0.0.1; pods sit on the
bridge `dpe2e0` (10.217.0.0/24, no default route, no masquerading), which also carries the node's
address 10.217.0.1 (node 2's: `dpe2e1`, 10.217.1.0/24, 10.217.1.1, routed to and from node 1's by
the host). The one Service pods use, `kubernetes` (10.0.0.1:443), is a single DNAT rule from each
bridge to the API server on 127.0.0.1:6443. There is no kube-proxy and no cluster DNS.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from e2e.cluster import cgroups, network
from e2e.cluster.components import MOUNTNS, components, write_configs
from e2e.cluster.images import ensure_images, import_images
from e2e.cluster.kubernetes_version import BadInput, chosen, feature_gates
from e2e.cluster.layout import (
    ETCD_CLIENT,
    FIRST,
    HERE,
    KUBELET_ROOT,
    NODES,
    PKI,
    REPO,
    RUN,
    RUNTIME_STATE,
    STATE,
    Node,
)
from e2e.cluster.pki import api_get, make_pki
from e2e.cluster.processes import (
    REAPER,
    STOP_ORDER,
    Component,
    defunct,
    in_namespace_of,
    kill_leftovers,
    pid_of,
    start,
    stop,
)
from e2e.cluster.served import GATES_FILE, VERSION_FILE
from e2e.cluster.shell import ClusterError, log, run, wait_for
from e2e.cluster.topology import ACCEPTED, Topology, asked, record, recorded

SIMULATED_NODE = Path("/var/lib/deviceplugin-sim")
SIMULATED_PRESET = "a100-80gb-x8-mixed"
# The dynamic-MIG node of manifests/overlays/simulated-node-dra-dynamic-mig: a root of its own.
DYNAMIC_PRESET = "a100-80gb-x8-dynamic"
FIRST_ROOTS = {"root": SIMULATED_PRESET, "dynamic-root": DYNAMIC_PRESET}
# The host commands `cluster` runs (here and in the modules beside this one), by the Debian
# package that has them: the `node` group of e2e/host-packages.txt (tests/test_host_packages.py
# keeps the two in step).
HOST_COMMANDS = {
    "ip": "iproute2",
    "iptables": "iptables",
    "openssl": "openssl",
    "mount": "mount",
    "umount": "mount",
    "unshare": "util-linux",
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


def component_names(nodes: Sequence[Node] = NODES) -> tuple[str, ...]:
    """Every component of the cluster with `nodes`, in the order they stop: the other nodes'
    before node 1's and the control plane (STOP_ORDER)."""
    return (*(name for node in nodes[1:] for name in node.components), *STOP_ORDER)


def prepare_host(nodes: Sequence[Node]) -> None:
    """Shared mount propagation (no systemd does it here), the pod network, the directories the
    components keep their state in, and the cgroup root of each node that has its own."""
    run(["mount", "--make-rshared", "/"])
    network.prepare_network(nodes)
    for path in (STATE, RUNTIME_STATE, KUBELET_ROOT, Path("/var/run/cdi"), Path("/etc/cdi")):
        path.mkdir(parents=True, exist_ok=True)
    mounted = cgroups.hierarchies(cgroups.MOUNTINFO.read_text())
    for node in nodes:
        if node.cgroup_root:
            cgroups.make_root(node.cgroup_root, mounted)


def prepare_simulated_node(
    directory: Path = SIMULATED_NODE,
    roots: Mapping[str, str] = FIRST_ROOTS,
) -> None:
    """The simulated GPU node's host files the overlays mount: a driver root of real character
    devices with the simulated libnvidia-ml.so.1 (`deviceplugin sim-root`, again for a root made
    before it carried the library or the marker that makes the daemons read its `proc/`), and
    `events.jsonl`, where tests append Xids: a relative link to the events file that library
    reads, so host and containers name the same file. The dynamic-MIG node gets a root of its
    own beside it (`dynamic-root`), so its MIG layout never touches the static scenarios'.
    Node 2's is the same under its own tree (`directory`), one root of its own preset: the
    library finds its node beside itself, so a root made here serves at the path its mount
    namespace shows it."""
    made = (
        "usr/lib/x86_64-linux-gnu/deviceplugin-sim-node.json",
        "etc/deviceplugin-sim/sim-root.json",
    )
    for name, preset in roots.items():
        root = directory / name
        if not all((root / path).is_file() for path in made):
            deviceplugin = REPO / ".venv" / "bin" / "deviceplugin"
            run([deviceplugin, "sim-root", preset, root])
    events = directory / "events.jsonl"
    target = Path("root/etc/deviceplugin-sim/events.jsonl")
    if not events.is_symlink() or events.readlink() != target:
        events.unlink(missing_ok=True)
        events.symlink_to(target)


def up(version: str, gates: dict[str, bool], topology: Topology) -> None:
    running = any(pid_of(name) for name in component_names())
    before = VERSION_FILE.read_text().strip() if VERSION_FILE.exists() else None
    if running and before not in (None, version):
        raise ClusterError(f"a Kubernetes {before} cluster is running: `cluster down` it first")
    was = recorded()
    if running and (
        was.count != topology.count
        or (topology.count > 1 and was.second_preset != topology.second_preset)
    ):
        shape = f"{was.count} node" + (f"s, node 2 {was.second_preset}" if was.count > 1 else "")
        raise ClusterError(f"a cluster of {shape} is running: `cluster down` it first")
    nodes = topology.nodes
    ensure_host_packages()
    bin_dir = binaries(version)
    helm()
    if not running:
        clean_host()  # a fresh start: nothing of an earlier cluster may linger
    ensure_images()
    RUN.mkdir(exist_ok=True)
    prepare_host(nodes)
    prepare_simulated_node()
    for node in nodes[1:]:
        prepare_simulated_node(node.host_path(SIMULATED_NODE), {"root": topology.second_preset})
    make_pki(nodes)
    write_configs(bin_dir, gates, nodes)
    VERSION_FILE.write_text(version + "\n")
    GATES_FILE.write_text(json.dumps(gates) + "\n")
    record(topology)
    every = components(bin_dir, gates, nodes)
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
    for node in nodes:
        start_node(node, every, bin_dir)
    publish_tools(bin_dir)
    for node in nodes:
        ready = functools.partial(node_ready, node.name)
        wait_for(f"node {node.name} Ready", ready, 180, node.kubelet)
    # Pods are refused until the controller manager has made the namespace's service account.
    wait_for(
        "service account default/default",
        lambda: bool(api_get("/api/v1/namespaces/default/serviceaccounts/default")),
        60,
        "kube-controller-manager",
    )
    kubectl = RUN / "bin" / "kubectl"
    names = ", ".join(node.name for node in nodes)
    log(f"up: Kubernetes {version}, {names} Ready; KUBECONFIG={RUN / 'kubeconfig'} {kubectl}")


def start_node(node: Node, every: Mapping[str, Component], bin_dir: Path) -> None:
    """The node's containerd with its images, then its kubelet; for a node with a mount
    namespace of its own, its holder first, once it has laid the namespace out."""
    if node.holder:
        start(every[node.holder])
        wait_for(f"{node.name}'s mount namespace", lambda: holds(node), 30, node.holder)
    start(every[node.containerd])
    wait_for(node.containerd, node.containerd_socket.is_socket, 60, node.containerd)
    import_images(bin_dir, node)
    start(every[node.kubelet])


def holds(node: Node) -> bool:
    """Whether the node's holder has laid out its namespace (it writes its pid when done)."""
    pid = pid_of(node.holder) if node.holder else None
    return pid is not None and node.namespace_ready.read_text().strip() == str(pid)


def publish_tools(bin_dir: Path) -> None:
    shutil.copyfile(RUN / "admin.kubeconfig", RUN / "kubeconfig")
    (RUN / "bin").mkdir(exist_ok=True)
    for tool in ("kubectl", "crictl", "ctr"):
        link = RUN / "bin" / tool
        link.unlink(missing_ok=True)
        link.symlink_to(bin_dir / tool)


def node_ready(name: str = FIRST.name) -> bool:
    node = json.loads(api_get(f"/api/v1/nodes/{name}"))
    return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])


def restart(name: str) -> None:
    saved = RUN / "cmdline" / name
    if not saved.exists():
        raise ClusterError(f"{name} was never started here (no {saved})")
    stop(name)
    start(Component(name, tuple(saved.read_text().split("\0"))))
    node = next((node for node in NODES if node.kubelet == name), None)
    if node is not None:
        healthz = f"http://127.0.0.1:{node.healthz_port}/healthz"
        wait_for(
            f"{name} healthz",
            lambda: urllib.request.urlopen(healthz, timeout=2).read() == b"ok",
            120,
            name,
        )
        wait_for(f"node {node.name} Ready", functools.partial(node_ready, node.name), 180, name)


def down() -> None:
    """Stops every pod, then every component, and removes what `up` put on the host: mounts
    under the cluster's directories, the pods' network namespaces, the bridges and the NAT rule,
    a second node's cgroup root and folders (its mount namespace ends with its last process)."""
    for node in NODES:
        stop(node.kubelet)
    crictl = RUN / "bin" / "crictl"
    for node in NODES:
        if pid_of(node.containerd) and crictl.exists():
            env_args = ["--config", str(node.config_dir / "crictl.yaml"), "--timeout", "30s"]
            for pod in run([crictl, *env_args, "pods", "-q"], check=False).split():
                run([crictl, *env_args, "stopp", pod], check=False)
                run([crictl, *env_args, "rmp", "-f", pod], check=False)
    for name in component_names():
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
    for node in NODES:
        if left := in_namespace_of(node):
            log(f"{node.name}: still in its mount namespace after SIGKILL: pids {sorted(left)}")
    unmount_under((KUBELET_ROOT, STATE, RUNTIME_STATE))
    network.remove_network()
    # The next `up` starts from an empty cluster; built binaries and imported images stay.
    for path in (
        STATE / "etcd",
        *(node.cni_data for node in NODES),
        KUBELET_ROOT,
        RUNTIME_STATE,
        PKI,
        SIMULATED_NODE,
        *(node.own_tree for node in NODES if node.own_tree),
    ):
        shutil.rmtree(path, ignore_errors=True)
    for node in NODES:  # a holder killed above left its file
        node.namespace_ready.unlink(missing_ok=True)


def unmount_under(roots: Sequence[Path]) -> None:
    prefixes = tuple(str(root) + "/" for root in roots) + tuple(str(root) for root in roots)
    mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    for target in sorted((m for m in mounts if m.startswith(prefixes)), key=len, reverse=True):
        run(["umount", "-l", target], check=False, quiet=True)


def status() -> int:
    nodes = recorded().nodes
    down_count = 0
    for name in reversed(component_names(nodes)):
        pid = pid_of(name)
        down_count += pid is None
        print(f"{name:24} {'running, pid ' + str(pid) if pid else 'stopped'}")
    for node in nodes:
        try:
            found = json.loads(api_get(f"/api/v1/nodes/{node.name}"))
            ready = [c["status"] for c in found["status"]["conditions"] if c["type"] == "Ready"]
            print(f"node {node.name}: Ready={ready[0] if ready else '?'}")
            for resource, count in sorted(found["status"]["allocatable"].items()):
                print(f"  allocatable {resource}: {count}")
        except (OSError, ValueError, KeyError) as exc:
            print(f"node {node.name}: API not reachable ({exc})")
            down_count += 1
        if node.own_tree is not None:
            print(f"  processes in its mount namespace: {len(in_namespace_of(node))}")
    reaper = pid_of(REAPER)
    print(f"{REAPER:24} {'running, pid ' + str(reaper) if reaper else 'stopped'}")
    left = defunct()
    print(f"defunct processes under the cluster: {len(left)}")
    for line in left:
        print(f"  {line}")
    return 0 if down_count == 0 else 3


def exec_argv(number: int, command: Sequence[str]) -> list[str]:
    """What `cluster exec NUMBER -- COMMAND` runs: COMMAND itself on node 1, which sees the
    host's own paths; in the node's mount namespace on another (mountns.py enter)."""
    node = NODES[number - 1]
    if node.holder is None:
        return list(command)
    return [sys.executable, str(MOUNTNS), "enter", str(node.namespace_ready), "--", *command]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cluster", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser(
        "up",
        help="build if needed, start everything, wait for the nodes to be Ready; the version is"
        " KUBERNETES_VERSION (a pinned minor, default the newest), FEATURE_GATES=A=true,B=false"
        " optional (otherwise the version's defaults), NODES 1 (default) or 2, NODE2_PRESET the"
        " second node's simulated node (default a10-x8)",
    )
    commands.add_parser("down", help="stop everything and clean the host")
    commands.add_parser("status", help="each component, each node and its allocatable")
    restart_parser = commands.add_parser("restart", help="stop and start one component")
    restart_parser.add_argument(
        "component", choices=[name for name in component_names() if not name.startswith("mountns")]
    )
    exec_parser = commands.add_parser(
        "exec", help="run a command in a node's view of the host: exec 2 -- sh -c '...'"
    )
    exec_parser.add_argument("node", choices=ACCEPTED)
    exec_parser.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND")
    args = parser.parse_args(argv)
    if args.command == "up":  # bad input is refused before anything is checked or done
        try:
            version, gates = chosen(os.environ), feature_gates(os.environ)
            topology = asked(os.environ)
        except BadInput as exc:
            print(f"cluster: {exc}", file=sys.stderr)
            return 2
    if args.command == "exec":
        command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
        if not command:
            exec_parser.error("no command to run (cluster exec NODE -- COMMAND...)")
        number = int(args.node)
        if number > 1 and os.geteuid() != 0:
            print(f"cluster: exec {number} needs root (joining a mount namespace)", file=sys.stderr)
            return 2
        command = exec_argv(number, command)
        os.execvp(command[0], command)
    if os.geteuid() != 0:
        if args.command == "up":  # name the missing packages too, so one sudo session does it
            subprocess.run([str(REPO / "e2e" / "host-packages.sh"), "--check", *PACKAGE_GROUPS])
        print("cluster: needs root (mounts, network, containerd, the kubelet)", file=sys.stderr)
        return 2
    try:
        if args.command == "up":
            up(version, gates, topology)
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
