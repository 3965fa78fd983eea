"""Where the cluster keeps its files and which names and addresses it uses: shared by every step
of `cluster` (node.py) and nothing else. Nothing leaves the machine: the control plane listens on
127.0.0.1, each node's pods sit on a bridge of its own that also carries the node's address.

Node 1 is the host's own view. Node 2 (`NODES=2`) runs its kubelet and containerd in a mount
namespace of its own (mountns.py) that shows its own tree at the host paths a node's daemons and
the DaemonSets use (OWN_PATHS); what else differs between the nodes is in `Node`."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
RUN = HERE / "run"
PKI = RUN / "pki"
LOGS = RUN / "logs"
PIDS = RUN / "pids"
STATE = Path("/var/lib/deviceplugin-e2e-cluster")
RUNTIME_STATE = Path("/run/deviceplugin-e2e-cluster")
KUBELET_ROOT = Path("/var/lib/kubelet")
CONTAINERD_SOCKET = RUNTIME_STATE / "containerd.sock"
CACHE = Path(os.environ.get("E2E_CLUSTER_CACHE", "/var/cache/deviceplugin-e2e/cluster"))
IMAGE_ARCHIVES = Path(os.environ.get("E2E_CLUSTER_IMAGES", "/var/cache/deviceplugin-e2e/images"))

NODE_NAME = "deviceplugin-e2e"
NODE_LABELS = "nvidia.com/gpu.present=true"
BRIDGE = "dpe2e0"
POD_SUBNET = "10.217.0.0/24"
NODE_IP = "10.217.0.1"
SERVICE_SUBNET = "10.0.0.0/24"
API_SERVICE_IP = "10.0.0.1"
API_PORT = 6443
ETCD_CLIENT = "127.0.0.1:23790"
ETCD_PEER = "127.0.0.1:23800"
PAUSE_IMAGE = "localhost/deviceplugin-e2e-pause:latest"

# The host paths a node has of its own, each with why: node 2's mount namespace shows its own
# tree at each of them (the same path under `Node.own_tree`), so nothing of node 1 is seen there.
OWN_PATHS = (
    Path("/var/lib/kubelet"),  # the kubelet's root: its sockets, pod volumes, plugin directories
    Path("/var/run/cdi"),  # CDI specs the plugin and the driver write, containerd reads
    Path("/etc/cdi"),  # the other CDI folder containerd reads
    Path("/var/lib/deviceplugin-sim"),  # the simulated node: its driver root and events file
    Path("/run/nvidia"),  # MPS: the plugin's pipe and log folders (mps.root)
    Path("/var/log/pods"),  # pod logs: a kubelet removes those of pods it does not know
    Path("/var/log/containers"),  # the kubelet's links to them
    Path("/run/containerd"),  # runc's state and the shims' sockets (fixed paths of containerd)
    Path("/var/run/nri"),  # containerd's NRI socket
    Path("/var/run/netns"),  # the pods' network namespaces, as containerd pins them
)


@dataclass(frozen=True)
class Node:
    """One node of the cluster: its name, address, bridge, pod range and kubelet ports, and the
    names and files of its own kubelet and containerd. Node 1's are the single-node cluster's
    as they always were; every other node's are derived from its number, so none is shared."""

    number: int
    name: str
    bridge: str
    pod_subnet: str
    ip: str
    kubelet_port: int
    healthz_port: int
    # The cgroup its pods' cgroups go under: node 1 the kubelet's default (the root), another
    # one of its own, so that neither kubelet ever takes the other's pod cgroups for orphans.
    cgroup_root: str

    @property
    def suffix(self) -> str:
        return "" if self.number == 1 else f"-{self.number}"

    @property
    def kubelet(self) -> str:
        """The kubelet's component name, also its client identity's (pki.py)."""
        return f"kubelet{self.suffix}"

    @property
    def containerd(self) -> str:
        return f"containerd{self.suffix}"

    @property
    def holder(self) -> str | None:
        """The component holding the node's mount namespace (mountns.py); node 1 has none."""
        return None if self.number == 1 else f"mountns{self.suffix}"

    @property
    def components(self) -> tuple[str, ...]:
        """The node's own components, in the order they stop."""
        return (self.kubelet, self.containerd, *([self.holder] if self.holder else []))

    @property
    def config_dir(self) -> Path:
        """Where its configuration files are written (kubelet.yaml, containerd.toml, cni/)."""
        return RUN if self.number == 1 else RUN / f"node{self.suffix}"

    @property
    def containerd_socket(self) -> Path:
        return RUNTIME_STATE / f"containerd{self.suffix}.sock"

    @property
    def containerd_root(self) -> Path:
        """containerd's root, images included: kept from one `up` to the next."""
        return STATE / f"containerd{self.suffix}"

    @property
    def containerd_state(self) -> Path:
        return RUNTIME_STATE / f"containerd{self.suffix}"

    @property
    def cni_data(self) -> Path:
        return STATE / f"cni{self.suffix}"

    @property
    def image_stamps(self) -> Path:
        return STATE / f"imported{self.suffix}"

    @property
    def own_tree(self) -> Path | None:
        """The host folder whose contents its mount namespace shows at OWN_PATHS; None for node
        1, which sees the host's own."""
        return None if self.number == 1 else STATE / f"node{self.suffix}"

    @property
    def namespace_ready(self) -> Path:
        """The holder writes its pid here once the namespace is laid out (mountns.py)."""
        return self.config_dir / "mountns"

    def host_path(self, path: Path) -> Path:
        """Where `path`, as this node sees it, is in the host's view."""
        if self.own_tree is None or not any(path.is_relative_to(own) for own in OWN_PATHS):
            return path
        return self.own_tree / path.relative_to("/")


FIRST = Node(1, NODE_NAME, BRIDGE, POD_SUBNET, NODE_IP, 10250, 10248, "")
SECOND = Node(
    2, f"{NODE_NAME}-2", "dpe2e1", "10.217.1.0/24", "10.217.1.1", 11250, 11248, f"/{NODE_NAME}-2"
)
NODES = (FIRST, SECOND)
