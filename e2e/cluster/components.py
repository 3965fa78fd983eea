"""What each component runs with: its exact command line, and the files it reads (CNI, containerd,
kubelet configuration, kubeconfigs). The same flags serve every pinned version (1.34 to 1.37 all
take them); feature gates are each version's defaults unless `FEATURE_GATES` names some."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from e2e.cluster.kubernetes_version import as_flag
from e2e.cluster.layout import (
    API_PORT,
    BRIDGE,
    CONTAINERD_SOCKET,
    ETCD_CLIENT,
    ETCD_PEER,
    KUBELET_ROOT,
    NODE_IP,
    NODE_LABELS,
    NODE_NAME,
    PAUSE_IMAGE,
    PKI,
    POD_SUBNET,
    RUN,
    RUNTIME_STATE,
    SERVICE_SUBNET,
    STATE,
)
from e2e.cluster.pki import kubeconfig
from e2e.cluster.processes import Component


def components(bin_dir: Path, gates: Mapping[str, bool]) -> dict[str, Component]:
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
            Component(
                "containerd",
                (
                    str(bin_dir / "containerd"),
                    f"--config={RUN / 'containerd.toml'}",
                ),
            ),
            Component(
                "kubelet",
                (
                    str(bin_dir / "kubelet"),
                    f"--config={RUN / 'kubelet.yaml'}",
                    f"--kubeconfig={RUN / 'kubelet.kubeconfig'}",
                    f"--hostname-override={NODE_NAME}",
                    f"--node-ip={NODE_IP}",
                    f"--node-labels={NODE_LABELS}",
                    f"--root-dir={KUBELET_ROOT}",
                    "--v=2",
                ),
            ),
        ]
    }


def write_configs(bin_dir: Path, gates: Mapping[str, bool]) -> None:
    cni_conf = RUN / "cni"
    cni_conf.mkdir(parents=True, exist_ok=True)
    (cni_conf / "10-deviceplugin-e2e.conflist").write_text(
        json.dumps(
            {
                "cniVersion": "1.0.0",
                "name": "deviceplugin-e2e",
                "plugins": [
                    {
                        "type": "bridge",
                        "bridge": BRIDGE,
                        "isGateway": True,
                        "isDefaultGateway": False,
                        "ipMasq": False,
                        "hairpinMode": True,
                        "ipam": {
                            "type": "host-local",
                            "ranges": [[{"subnet": POD_SUBNET, "gateway": NODE_IP}]],
                            # Only the Service range goes to the node; nothing else is routable.
                            "routes": [{"dst": SERVICE_SUBNET}],
                            "dataDir": str(STATE / "cni"),
                        },
                    },
                    {"type": "loopback"},
                ],
            },
            indent=2,
        )
        + "\n"
    )
    (RUN / "containerd.toml").write_text(f"""\
version = 3
root = "{STATE / "containerd"}"
state = "{RUNTIME_STATE / "containerd"}"

[grpc]
  address = "{CONTAINERD_SOCKET}"

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
    conf_dir = "{cni_conf}"
""")
    (RUN / "resolv.conf").write_text("# no cluster DNS and no resolver: pods resolve nothing\n")
    (RUN / "kubelet.yaml").write_text(
        json.dumps(
            {
                "apiVersion": "kubelet.config.k8s.io/v1beta1",
                "kind": "KubeletConfiguration",
                "address": NODE_IP,
                "cgroupDriver": "cgroupfs",
                # This machine's hybrid cgroup layout counts as v1; refused by default since 1.35.
                "failCgroupV1": False,
                "failSwapOn": False,
                "containerRuntimeEndpoint": f"unix://{CONTAINERD_SOCKET}",
                "authentication": {
                    "anonymous": {"enabled": False},
                    "webhook": {"enabled": True},
                    "x509": {"clientCAFile": str(PKI / "ca.crt")},
                },
                "authorization": {"mode": "Webhook"},
                "tlsCertFile": str(PKI / "kubelet-serving.crt"),
                "tlsPrivateKeyFile": str(PKI / "kubelet-serving.key"),
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
            },
            indent=2,
        )
        + "\n"
    )
    kubeconfig("kubelet")
    kubeconfig("controller-manager")
    kubeconfig("scheduler")
    kubeconfig("admin")
