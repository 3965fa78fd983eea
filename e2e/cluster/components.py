"""What each component runs with: its exact command line, and the files it reads (CNI, containerd,
kubelet configuration, kubeconfigs, a second node's mount plan). The same flags serve every pinned
version (1.34 to 1.37 all take them); feature gates are each version's defaults unless
`FEATURE_GATES` names some. Every node has its own kubelet and containerd; a node after the
first runs both in its mount namespace (mountns.py), held by a component of its own."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TypedDict

from e2e.cluster.kubernetes_version import as_flag
from e2e.cluster.layout import (
    API_PORT,
    ETCD_CLIENT,
    ETCD_PEER,
    FIRST,
    HERE,
    KUBELET_ROOT,
    NODE_IP,
    NODE_LABELS,
    OWN_PATHS,
    PAUSE_IMAGE,
    PKI,
    RUN,
    RUNTIME_STATE,
    SERVICE_SUBNET,
    STATE,
    Node,
)
from e2e.cluster.pki import kubeconfig
from e2e.cluster.processes import Component

MOUNTNS = HERE / "mountns.py"


def components(
    bin_dir: Path, gates: Mapping[str, bool], nodes: Sequence[Node] = (FIRST,)
) -> dict[str, Component]:
    """Each component with its exact command line; `gates` go to every control-plane component
    (the kubelet reads them from its configuration file)."""
    pki = PKI
    return {
        c.name: c
        for c in [
            Component(
                "etcd",
                (
                    str(bin_dir / "etcd"),
                    "--name=e2e",
                    f"--data-dir={STATE / 'etcd'}",
                    f"--listen-client-urls=http://{ETCD_CLIENT}",
                    f"--advertise-client-urls=http://{ETCD_CLIENT}",
                    f"--listen-peer-urls=http://{ETCD_PEER}",
                    f"--initial-advertise-peer-urls=http://{ETCD_PEER}",
                    f"--initial-cluster=e2e=http://{ETCD_PEER}",
                    "--log-level=warn",
                ),
            ),
            Component(
                "kube-apiserver",
                (
                    str(bin_dir / "kube-apiserver"),
                    f"--etcd-servers=http://{ETCD_CLIENT}",
                    "--bind-address=127.0.0.1",
                    f"--secure-port={API_PORT}",
                    f"--advertise-address={NODE_IP}",
                    f"--service-cluster-ip-range={SERVICE_SUBNET}",
                    f"--client-ca-file={pki / 'ca.crt'}",
                    f"--tls-cert-file={pki / 'apiserver.crt'}",
                    f"--tls-private-key-file={pki / 'apiserver.key'}",
                    f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
                    f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
                    "--kubelet-preferred-address-types=InternalIP",
                    f"--service-account-key-file={pki / 'sa.pub'}",
                    f"--service-account-signing-key-file={pki / 'sa.key'}",
                    "--service-account-issuer=https://kubernetes.default.svc",
                    "--authorization-mode=Node,RBAC",
                    "--enable-admission-plugins=NodeRestriction",
                    # As kubeadm's: NVIDIA's DRA driver runs an MPS claim's control daemon
                    # as a privileged pod (test_reference_dra_mps.py). Ours run unprivileged.
                    "--allow-privileged=true",
                    # v1 is served by default; the betas too, so that objects written for them
                    # apply unchanged.
                    "--runtime-config=resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true",
                    "--endpoint-reconciler-type=none",
                    *as_flag(gates),
                    "--v=1",
                ),
            ),
            Component(
                "kube-controller-manager",
                (
                    str(bin_dir / "kube-controller-manager"),
                    f"--kubeconfig={RUN / 'controller-manager.kubeconfig'}",
                    f"--authentication-kubeconfig={RUN / 'controller-manager.kubeconfig'}",
                    f"--authorization-kubeconfig={RUN / 'controller-manager.kubeconfig'}",
                    "--bind-address=127.0.0.1",
                    "--leader-elect=false",
                    "--use-service-account-credentials",
                    f"--service-account-private-key-file={pki / 'sa.key'}",
                    f"--root-ca-file={pki / 'ca.crt'}",
                    f"--cluster-signing-cert-file={pki / 'ca.crt'}",
                    f"--cluster-signing-key-file={pki / 'ca.key'}",
                    f"--service-cluster-ip-range={SERVICE_SUBNET}",
                    "--controllers=*",
                    *as_flag(gates),
                    "--v=1",
                ),
            ),
            Component(
                "kube-scheduler",
                (
                    str(bin_dir / "kube-scheduler"),
                    f"--kubeconfig={RUN / 'scheduler.kubeconfig'}",
                    f"--authentication-kubeconfig={RUN / 'scheduler.kubeconfig'}",
                    f"--authorization-kubeconfig={RUN / 'scheduler.kubeconfig'}",
                    "--bind-address=127.0.0.1",
                    "--leader-elect=false",
                    *as_flag(gates),
                    "--v=1",
                ),
            ),
        ]
        + [c for node in nodes for c in node_components(bin_dir, node)]
    }


def node_components(bin_dir: Path, node: Node) -> list[Component]:
    """A node's containerd and kubelet; for a node after the first, the holder of its mount
    namespace first, and both daemons started in that namespace."""
    containerd = (str(bin_dir / "containerd"), f"--config={node.config_dir / 'containerd.toml'}")
    kubelet = (
        str(bin_dir / "kubelet"),
        f"--config={node.config_dir / 'kubelet.yaml'}",
        f"--kubeconfig={RUN / (node.kubelet + '.kubeconfig')}",
        f"--hostname-override={node.name}",
        f"--node-ip={node.ip}",
        f"--node-labels={NODE_LABELS}",
        f"--root-dir={KUBELET_ROOT}",  # the node's own, where it has a namespace
        "--v=2",
    )
    if node.holder is None:
        return [Component(node.containerd, containerd), Component(node.kubelet, kubelet)]
    ready = str(node.namespace_ready)
    holder = (
        *("unshare", "--mount", "--propagation", "private"),
        *(sys.executable, str(MOUNTNS), "hold", ready, str(node.config_dir / "mounts.json")),
    )
    inside = (sys.executable, str(MOUNTNS), "enter", ready, "--")
    return [
        Component(node.holder, holder),
        Component(node.containerd, (*inside, *containerd)),
        Component(node.kubelet, (*inside, *kubelet)),
    ]


class MountPlan(TypedDict):
    detach: list[str]
    bind: list[list[str]]


def mount_plan(node: Node) -> MountPlan:
    """What a node's namespace holder lays out (mountns.py): node 1's mounts beneath the node's
    own paths and the cluster's state folders detached, then the node's own tree over its own
    paths."""
    assert node.own_tree is not None, f"node {node.number} sees the host's own paths"
    return {
        "detach": [str(path) for path in (*OWN_PATHS, STATE, RUNTIME_STATE)],
        "bind": [[str(node.host_path(path)), str(path)] for path in OWN_PATHS],
    }


def write_configs(
    bin_dir: Path, gates: Mapping[str, bool], nodes: Sequence[Node] = (FIRST,)
) -> None:
    (RUN / "resolv.conf").write_text("# no cluster DNS and no resolver: pods resolve nothing\n")
    for node in nodes:
        (node.config_dir / "cni").mkdir(parents=True, exist_ok=True)
        conflist = node.config_dir / "cni" / f"10-{network_name(node)}.conflist"
        conflist.write_text(json.dumps(cni_config(node, nodes), indent=2) + "\n")
        (node.config_dir / "containerd.toml").write_text(containerd_config(bin_dir, node))
        (node.config_dir / "kubelet.yaml").write_text(
            json.dumps(kubelet_config(node, gates), indent=2) + "\n"
        )
        (node.config_dir / "crictl.yaml").write_text(
            f"runtime-endpoint: unix://{node.containerd_socket}\n"
            f"image-endpoint: unix://{node.containerd_socket}\n"
        )
        if node.own_tree is not None:
            (node.config_dir / "mounts.json").write_text(json.dumps(mount_plan(node), indent=2))
        kubeconfig(node.kubelet)
    kubeconfig("controller-manager")
    kubeconfig("scheduler")
    kubeconfig("admin")


def network_name(node: Node) -> str:
    return f"deviceplugin-e2e{node.suffix}"


def cni_config(node: Node, nodes: Sequence[Node]) -> dict[str, object]:
    """The node's pod network: its bridge and pod range, its address the pods' gateway. Only
    the Service range and the other nodes' pod ranges go to the host, which routes between the
    bridges; nothing else is routable."""
    others = [{"dst": other.pod_subnet} for other in nodes if other != node]
    return {
        "cniVersion": "1.0.0",
        "name": network_name(node),
        "plugins": [
            {
                "type": "bridge",
                "bridge": node.bridge,
                "isGateway": True,
                "isDefaultGateway": False,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": node.pod_subnet, "gateway": node.ip}]],
                    "routes": [{"dst": SERVICE_SUBNET}, *others],
                    "dataDir": str(node.cni_data),
                },
            },
            {"type": "loopback"},
        ],
    }


def containerd_config(bin_dir: Path, node: Node) -> str:
    return f"""\
version = 3
root = "{node.containerd_root}"
state = "{node.containerd_state}"

[grpc]
  address = "{node.containerd_socket}"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{PAUSE_IMAGE}"

[plugins.'io.containerd.cri.v1.runtime']
  # No process here holds CAP_SYS_RESOURCE, so none may lower an oom_score_adj below 0 (the
  # kubelet asks -998 for every sandbox): keep containers at containerd's own value or above.
  restrict_oom_score_adj = true
  enable_cdi = true
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "{bin_dir / "runc"}"
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{bin_dir / "cni"}"]
    conf_dir = "{node.config_dir / "cni"}"
"""


def kubelet_config(node: Node, gates: Mapping[str, bool]) -> dict[str, object]:
    """The node's kubelet configuration: its own address, ports, runtime and serving
    certificate, and, for a node after the first, its own cgroup root."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": node.ip,
        "port": node.kubelet_port,
        "healthzPort": node.healthz_port,
        **({"cgroupRoot": node.cgroup_root} if node.cgroup_root else {}),
        "cgroupDriver": "cgroupfs",
        # This machine's hybrid cgroup layout counts as v1; refused by default since 1.35.
        "failCgroupV1": False,
        "failSwapOn": False,
        "containerRuntimeEndpoint": f"unix://{node.containerd_socket}",
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(PKI / "ca.crt")},
        },
        "authorization": {"mode": "Webhook"},
        "tlsCertFile": str(PKI / f"{node.kubelet}-serving.crt"),
        "tlsPrivateKeyFile": str(PKI / f"{node.kubelet}-serving.key"),
        "resolvConf": str(RUN / "resolv.conf"),
        # A small shared disk: never evict for disk or image pressure, never collect images
        # (they come from local archives and cannot be pulled again).
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "0%",
            "nodefs.inodesFree": "0%",
            "imagefs.available": "0%",
        },
        "imageGCHighThresholdPercent": 100,
        # ConfigMap volumes follow an edit within seconds rather than a minute.
        "syncFrequency": "10s",
        "serializeImagePulls": False,
        # bench/cluster.py runs 200 pods on this one node.
        "maxPods": 250,
        **({"featureGates": dict(gates)} if gates else {}),
    }
