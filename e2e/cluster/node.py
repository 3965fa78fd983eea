"""A real single-node Kubernetes cluster on this machine, with no systemd: `cluster up|down|status|
restart COMPONENT` (the `cluster` script next to this file runs it).

Every component is a plain background process started here, its PID kept in `run/pids/` and its
output in `run/logs/`: etcd, kube-apiserver (TLS, RBAC, service-account keys made here,
resource.k8s.io v1 with v1beta1 and v1beta2 served too), kube-controller-manager,
kube-scheduler, containerd (CRI, cgroupfs, CDI on /etc/cdi and /var/run/cdi, images imported
from local archives) and the kubelet (a registered Node, cgroup v1 allowed). The binaries come
from `build.sh` (built from source, cached outside the clone).

Network: nothing leaves the machine. The control plane listens on 127.0.0.1; pods sit on the
bridge `dpe2e0` (10.217.0.0/24, no default route, no masquerading), which also carries the node's
address 10.217.0.1. The one Service pods use, `kubernetes` (10.0.0.1:443), is a single DNAT rule
from the bridge to the API server on 127.0.0.1:6443. There is no kube-proxy and no cluster DNS.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tarfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
RUN = HERE / "run"
PKI = RUN / "pki"
LOGS = RUN / "logs"
PIDS = RUN / "pids"
REAPER = "reaper"
REAPER_SOCKET = RUN / "reaper.sock"
STATE = Path("/var/lib/deviceplugin-e2e-cluster")
RUNTIME_STATE = Path("/run/deviceplugin-e2e-cluster")
KUBELET_ROOT = Path("/var/lib/kubelet")
CONTAINERD_SOCKET = RUNTIME_STATE / "containerd.sock"
CACHE = Path(os.environ.get("E2E_CLUSTER_CACHE", "/var/cache/deviceplugin-e2e/cluster"))
IMAGE_ARCHIVES = Path(os.environ.get("E2E_CLUSTER_IMAGES", "/var/cache/deviceplugin-e2e/images"))

SIMULATED_NODE = Path("/var/lib/deviceplugin-sim")
SIMULATED_PRESET = "a100-80gb-x8-mixed"
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
NAT_CHAIN = "DPE2E-SERVICES"
IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")
# The host commands this file runs, by the Debian package that has them: the `node` group of
# e2e/host-packages.txt (tests/test_host_packages.py keeps the two in step).
HOST_COMMANDS = {
    "ip": "iproute2",
    "iptables": "iptables",
    "openssl": "openssl",
    "mount": "mount",
    "umount": "mount",
}
# Binaries of the cluster that are not components: started by containerd, the kubelet or by hand.
CLUSTER_HELPERS = (
    "containerd-shim-runc-v2",
    "runc",
    "ctr",
    "crictl",
    "pause",
    "bridge",
    "loopback",
    "host-local",
    "portmap",
)
# `up` builds the node, runs it and makes its images: e2e/host-packages.txt's groups for each.
PACKAGE_GROUPS = ("build", "node", "images")
STOP_ORDER = (
    "kubelet",
    "containerd",
    "kube-scheduler",
    "kube-controller-manager",
    "kube-apiserver",
    "etcd",
)


def log(message: str) -> None:
    print(f"[cluster] {message}", file=sys.stderr, flush=True)


class ClusterError(Exception):
    """A step failed; the message says which and where its log is."""


def run(args: Sequence[str | Path], *, check: bool = True, quiet: bool = False) -> str:
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise ClusterError(
            f"{' '.join(map(str, args))}: exit {done.returncode}: {done.stderr.strip()}"
        )
    if not quiet and done.stderr.strip() and done.returncode != 0:
        log(done.stderr.strip())
    return done.stdout


def wait_for(what: str, ready: Callable[[], bool], timeout: float, log_name: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if ready():
                return
        except (OSError, ClusterError, ValueError):
            pass
        time.sleep(0.5)
    where = f"; see {LOGS / (log_name + '.log')}" if log_name else ""
    raise ClusterError(f"{what} not ready after {timeout:.0f} s{where}")


# --- binaries ------------------------------------------------------------------------------------


def ensure_host_packages() -> None:
    """What `up` needs on the host, installed before the long build rather than missed after it:
    the build's, the node's and the images' packages (e2e/host-packages.txt)."""
    script = REPO / "e2e" / "host-packages.sh"
    if subprocess.run([str(script), *PACKAGE_GROUPS]).returncode != 0:
        raise ClusterError(f"{script} could not provide the host packages (see above)")
    absent = [f"{cmd} ({pkg})" for cmd, pkg in HOST_COMMANDS.items() if not shutil.which(cmd)]
    if absent:
        raise ClusterError(f"host commands missing: {', '.join(absent)}")


def binaries() -> Path:
    """The cached build (build.sh builds it once per version set)."""
    done = subprocess.run([str(HERE / "build.sh")], stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise ClusterError("build.sh failed (its output is above)")
    return Path(done.stdout.strip().splitlines()[-1])


def helm() -> None:
    """Helm at run/bin/helm, beside kubectl: e2e/helm/build.sh builds it once from its own
    go.mod (cached outside the clone) and links it there."""
    done = subprocess.run([str(REPO / "e2e" / "helm" / "build.sh")], stdout=subprocess.DEVNULL)
    if done.returncode != 0:
        raise ClusterError("e2e/helm/build.sh failed (its output is above)")


# --- certificates --------------------------------------------------------------------------------


def openssl(*args: str | Path) -> None:
    run(["openssl", *args])


def make_pki() -> None:
    """A CA, the API server's serving certificate, a client certificate per identity and the
    service-account key pair; made once and kept until `down`."""
    if (PKI / "done").exists():
        return
    PKI.mkdir(parents=True, exist_ok=True)
    ca = PKI / "ca"
    openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "30",
        "-subj",
        "/CN=deviceplugin-e2e-ca",
        "-keyout",
        f"{ca}.key",
        "-out",
        f"{ca}.crt",
    )
    openssl("genrsa", "-out", PKI / "sa.key", "2048")
    openssl("rsa", "-in", PKI / "sa.key", "-pubout", "-out", PKI / "sa.pub")
    sans = ",".join(
        [
            "DNS:localhost",
            "DNS:kubernetes",
            "DNS:kubernetes.default",
            "DNS:kubernetes.default.svc",
            "DNS:kubernetes.default.svc.cluster.local",
            f"DNS:{NODE_NAME}",
            "IP:127.0.0.1",
            f"IP:{API_SERVICE_IP}",
            f"IP:{NODE_IP}",
        ]
    )
    certificate("apiserver", "/CN=kube-apiserver", sans, "serverAuth")
    certificate(
        "kubelet-serving",
        f"/CN={NODE_NAME}",
        f"DNS:{NODE_NAME},IP:{NODE_IP},IP:127.0.0.1",
        "serverAuth",
    )
    for name, subject in CLIENTS.items():
        certificate(name, subject, "", "clientAuth")
    (PKI / "done").touch()


CLIENTS = {
    "admin": "/O=system:masters/CN=kubernetes-admin",
    "apiserver-kubelet-client": "/O=system:masters/CN=kube-apiserver-kubelet-client",
    "controller-manager": "/CN=system:kube-controller-manager",
    "scheduler": "/CN=system:kube-scheduler",
    "kubelet": f"/O=system:nodes/CN=system:node:{NODE_NAME}",
}


def certificate(name: str, subject: str, sans: str, usage: str) -> None:
    key, csr, crt, ext = (PKI / f"{name}.{suffix}" for suffix in ("key", "csr", "crt", "ext"))
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", subject, "-keyout", key, "-out", csr)
    lines = [f"extendedKeyUsage={usage}", "keyUsage=critical,digitalSignature,keyEncipherment"]
    if sans:
        lines.append(f"subjectAltName={sans}")
    ext.write_text("\n".join(lines) + "\n")
    openssl(
        "x509",
        "-req",
        "-in",
        csr,
        "-CA",
        PKI / "ca.crt",
        "-CAkey",
        PKI / "ca.key",
        "-CAcreateserial",
        "-days",
        "30",
        "-extfile",
        ext,
        "-out",
        crt,
    )


def kubeconfig(name: str) -> Path:
    """A kubeconfig for one client identity, talking to the API server on loopback."""
    path = RUN / f"{name}.kubeconfig"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "e2e",
                "cluster": {
                    "server": f"https://127.0.0.1:{API_PORT}",
                    "certificate-authority": str(PKI / "ca.crt"),
                },
            }
        ],
        "users": [
            {
                "name": name,
                "user": {
                    "client-certificate": str(PKI / f"{name}.crt"),
                    "client-key": str(PKI / f"{name}.key"),
                },
            }
        ],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": name}}],
        "current-context": "e2e",
    }
    path.write_text(json.dumps(config, indent=2) + "\n")
    return path


def api_get(path: str) -> bytes:
    context = ssl.create_default_context(cafile=str(PKI / "ca.crt"))
    context.load_cert_chain(str(PKI / "admin.crt"), str(PKI / "admin.key"))
    url = f"https://127.0.0.1:{API_PORT}{path}"
    with urllib.request.urlopen(url, context=context, timeout=5) as answer:
        return bytes(answer.read())


# --- processes -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Component:
    name: str
    args: tuple[str, ...]


def pid_of(name: str) -> int | None:
    try:
        pid = int((PIDS / f"{name}.pid").read_text())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid


def start(component: Component) -> None:
    if pid_of(component.name):
        log(f"{component.name}: already running")
        return
    LOGS.mkdir(parents=True, exist_ok=True)
    PIDS.mkdir(parents=True, exist_ok=True)
    (RUN / "cmdline").mkdir(exist_ok=True)
    (RUN / "cmdline" / component.name).write_text("\0".join(component.args))
    log_path = LOGS / f"{component.name}.log"
    pid = ask_reaper({"args": component.args, "log": str(log_path), "env": dict(os.environ)})
    (PIDS / f"{component.name}.pid").write_text(str(pid))
    log(f"{component.name}: started (pid {pid}, log {log_path})")


def ask_reaper(request: dict[str, object]) -> int:
    """Starts a component as the reaper's child (reaper.py), so that it and every orphan it
    leaves (containerd's shims) are reaped when they end; starts the reaper first if need be."""
    if not pid_of(REAPER):
        PIDS.mkdir(parents=True, exist_ok=True)
        with open(LOGS / f"{REAPER}.log", "ab") as out:
            process = subprocess.Popen(
                [sys.executable, str(HERE / "reaper.py"), str(REAPER_SOCKET)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        (PIDS / f"{REAPER}.pid").write_text(str(process.pid))
        wait_for("reaper", REAPER_SOCKET.is_socket, 10, REAPER)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(10)
        conn.connect(str(REAPER_SOCKET))
        conn.sendall(json.dumps(request).encode() + b"\n")
        reply = json.loads(conn.makefile("rb").readline() or b"{}")
    if "pid" not in reply:
        raise ClusterError(f"the reaper could not start {request['args']}: {reply.get('error')}")
    return int(reply["pid"])


def stop(name: str, timeout: float = 20) -> None:
    pid = pid_of(name)
    if pid is None:
        (PIDS / f"{name}.pid").unlink(missing_ok=True)
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and pid_of(name):
        time.sleep(0.2)
    if pid_of(name):
        os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
    (PIDS / f"{name}.pid").unlink(missing_ok=True)
    log(f"{name}: stopped")


def components(bin_dir: Path) -> dict[str, Component]:
    """Each component with its exact command line."""
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
                    # v1 is served by default; the betas too, so that objects written for them
                    # apply unchanged.
                    "--runtime-config=resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true",
                    "--endpoint-reconciler-type=none",
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


# --- host ----------------------------------------------------------------------------------------


def prepare_host() -> None:
    """Shared mount propagation (no systemd does it here), the pod bridge with the node's
    address, and the one NAT rule that makes the `kubernetes` Service reach the API server."""
    run(["mount", "--make-rshared", "/"])
    # The bridge plugin turns IPv4 forwarding on (the node's address is the pods' gateway);
    # `down` puts back what the host had.
    saved = STATE / "ip_forward"
    if not saved.exists():
        STATE.mkdir(parents=True, exist_ok=True)
        saved.write_text(IP_FORWARD.read_text())
    if run(["ip", "link", "show", BRIDGE], check=False, quiet=True) == "":
        run(["ip", "link", "add", BRIDGE, "type", "bridge"])
        run(["ip", "addr", "add", f"{NODE_IP}/24", "dev", BRIDGE])
    run(["ip", "link", "set", BRIDGE, "up"])
    # DNAT to 127.0.0.1 from another interface needs route_localnet on that interface.
    Path(f"/proc/sys/net/ipv4/conf/{BRIDGE}/route_localnet").write_text("1\n")
    if run(["iptables", "-t", "nat", "-n", "-L", NAT_CHAIN], check=False, quiet=True) == "":
        run(["iptables", "-t", "nat", "-N", NAT_CHAIN])
        run(
            [
                "iptables",
                "-t",
                "nat",
                "-A",
                NAT_CHAIN,
                "-d",
                f"{API_SERVICE_IP}/32",
                "-p",
                "tcp",
                "--dport",
                "443",
                "-j",
                "DNAT",
                "--to-destination",
                f"127.0.0.1:{API_PORT}",
            ]
        )
        run(["iptables", "-t", "nat", "-I", "PREROUTING", "-i", BRIDGE, "-j", NAT_CHAIN])
    for path in (STATE, RUNTIME_STATE, KUBELET_ROOT, Path("/var/run/cdi"), Path("/etc/cdi")):
        path.mkdir(parents=True, exist_ok=True)


def write_configs(bin_dir: Path) -> None:
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
            },
            indent=2,
        )
        + "\n"
    )
    kubeconfig("kubelet")
    kubeconfig("controller-manager")
    kubeconfig("scheduler")
    kubeconfig("admin")


# --- images --------------------------------------------------------------------------------------


def ctr(bin_dir: Path, *args: str | Path) -> str:
    return run([bin_dir / "ctr", "--address", CONTAINERD_SOCKET, "-n", "k8s.io", *args])


def import_images(bin_dir: Path) -> None:
    """The pause image (made here from the built pause binary) and every archive in
    IMAGE_ARCHIVES, into the namespace the CRI uses; no registry is ever asked."""
    present = ctr(bin_dir, "images", "ls", "-q").split()
    if PAUSE_IMAGE not in present:
        archive = RUN / "pause.tar"
        write_single_binary_image(bin_dir / "pause", PAUSE_IMAGE, archive)
        ctr(bin_dir, "images", "import", archive)
        log(f"images: imported {PAUSE_IMAGE}")
    stamps = STATE / "imported"
    stamps.mkdir(parents=True, exist_ok=True)
    if IMAGE_ARCHIVES.is_dir():
        for archive in sorted(IMAGE_ARCHIVES.glob("*.tar")):
            seen = f"{archive.stat().st_mtime_ns} {archive.stat().st_size}"
            stamp = stamps / archive.name
            if stamp.exists() and stamp.read_text() == seen:
                continue
            ctr(bin_dir, "images", "import", archive)
            stamp.write_text(seen)
            log(f"images: imported {archive.name}")


def write_single_binary_image(binary: Path, name: str, archive: Path) -> None:
    """An OCI image archive holding one static binary as its entrypoint."""
    layer_buffer = io.BytesIO()
    with tarfile.open(fileobj=layer_buffer, mode="w") as layer:
        info = layer.gettarinfo(str(binary), arcname=binary.name)
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mtime = 0
        with open(binary, "rb") as content:
            layer.addfile(info, content)
    layer_bytes = layer_buffer.getvalue()
    blobs: dict[str, bytes] = {}

    def blob(data: bytes) -> dict[str, object]:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return {"digest": digest, "size": len(data)}

    layer_desc = {"mediaType": "application/vnd.oci.image.layer.v1.tar", **blob(layer_bytes)}
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": [f"/{binary.name}"]},
            "rootfs": {"type": "layers", "diff_ids": [layer_desc["digest"]]},
        }
    ).encode()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **blob(config)},
            "layers": [layer_desc],
        }
    ).encode()
    index = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    **blob(manifest),
                    "annotations": {
                        "io.containerd.image.name": name,
                        "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1],
                    },
                }
            ],
        }
    ).encode()
    with tarfile.open(archive, "w") as out:
        entries = {"oci-layout": b'{"imageLayoutVersion": "1.0.0"}', "index.json": index}
        entries.update({f"blobs/sha256/{d.removeprefix('sha256:')}": b for d, b in blobs.items()})
        for path, data in entries.items():
            info = tarfile.TarInfo(path)
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))


# --- commands ------------------------------------------------------------------------------------


def ensure_images() -> None:
    """The plugin's two images and the workload image, built here if missing or stale (podman,
    from the local Debian base) and saved as archives for containerd (`make cluster-images`)."""
    if os.environ.get("E2E_CLUSTER_SKIP_IMAGES") == "1":
        return
    done = subprocess.run(["make", "-C", str(REPO), "--no-print-directory", "cluster-images"])
    if done.returncode != 0:
        raise ClusterError("make cluster-images failed (its output is above)")


def prepare_simulated_node() -> None:
    """The simulated GPU node's host files the overlays mount: a driver root of real character
    devices with the simulated libnvidia-ml.so.1 (`deviceplugin sim-root`, again for a root made
    before it carried the library), and `events.jsonl`, where tests append Xids: a relative link
    to the events file that library reads, so host and containers name the same file."""
    root = SIMULATED_NODE / "root"
    if not (root / "usr/lib/x86_64-linux-gnu/deviceplugin-sim-node.json").is_file():
        deviceplugin = REPO / ".venv" / "bin" / "deviceplugin"
        run([deviceplugin, "sim-root", SIMULATED_PRESET, root])
    events = SIMULATED_NODE / "events.jsonl"
    target = Path("root/etc/deviceplugin-sim/events.jsonl")
    if not events.is_symlink() or events.readlink() != target:
        events.unlink(missing_ok=True)
        events.symlink_to(target)


def up() -> None:
    ensure_host_packages()
    bin_dir = binaries()
    helm()
    if not any(pid_of(name) for name in STOP_ORDER):
        clean_host()  # a fresh start: nothing of an earlier cluster may linger
    ensure_images()
    RUN.mkdir(exist_ok=True)
    prepare_host()
    prepare_simulated_node()
    make_pki()
    write_configs(bin_dir)
    every = components(bin_dir)
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
    log(f"up: node {NODE_NAME} Ready; KUBECONFIG={RUN / 'kubeconfig'} {RUN / 'bin' / 'kubectl'}")


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
    for netns in run(["ip", "netns", "list"], check=False).split("\n"):
        name = netns.split(" ")[0]
        if name.startswith("cni-"):
            run(["ip", "netns", "delete", name], check=False)
    run(
        ["iptables", "-t", "nat", "-D", "PREROUTING", "-i", BRIDGE, "-j", NAT_CHAIN],
        check=False,
        quiet=True,
    )
    run(["iptables", "-t", "nat", "-F", NAT_CHAIN], check=False, quiet=True)
    run(["iptables", "-t", "nat", "-X", NAT_CHAIN], check=False, quiet=True)
    run(["ip", "link", "delete", BRIDGE], check=False, quiet=True)
    saved = STATE / "ip_forward"
    if saved.exists():
        IP_FORWARD.write_text(saved.read_text())
        saved.unlink()
    # The next `up` starts from an empty cluster; built binaries and imported images stay.
    for path in (STATE / "etcd", STATE / "cni", KUBELET_ROOT, RUNTIME_STATE, PKI, SIMULATED_NODE):
        shutil.rmtree(path, ignore_errors=True)


def kill_leftovers() -> None:
    """Every process run from the cluster's binaries (components, shims) and every process in
    the pods' cgroups, then those cgroups themselves."""
    for pid in binary_pids():
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    pod_cgroups = sorted(Path("/sys/fs/cgroup").glob("*/kubepods"))
    for root in pod_cgroups:
        for procs in root.rglob("cgroup.procs"):
            for member in procs.read_text().split():
                with contextlib.suppress(OSError):
                    os.kill(int(member), signal.SIGKILL)
    time.sleep(0.5)
    for root in pod_cgroups:
        for cgroup in sorted(
            (p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)
        ):
            with contextlib.suppress(OSError):
                cgroup.rmdir()
        with contextlib.suppress(OSError):
            root.rmdir()


def processes() -> dict[int, tuple[str, str, int]]:
    """pid -> (comm, state, ppid) for every process, from /proc/PID/stat."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError):
            stat = (proc / "stat").read_text()
            comm = stat[stat.index("(") + 1 : stat.rindex(")")]
            state, ppid = stat[stat.rindex(")") + 2 :].split()[:2]
            found[int(proc.name)] = (comm, state, int(ppid))
    return found


def binary_pids() -> set[int]:
    """Every live process run from the cluster's binaries (components, shims)."""
    pids = set()
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError):
            if os.readlink(proc / "exe").startswith(str(CACHE) + "/"):
                pids.add(int(proc.name))
    return pids


def defunct() -> list[str]:
    """`<defunct>` processes of the cluster: named after one of its binaries (the kernel keeps
    15 characters of a name), or children of the reaper or of a cluster process."""
    names = {name[:15] for name in (*STOP_ORDER, *CLUSTER_HELPERS)}
    parents = binary_pids() | {pid for pid in [pid_of(REAPER)] if pid}
    return [
        f"pid {pid} [{comm}] <defunct>, parent {ppid}"
        for pid, (comm, state, ppid) in sorted(processes().items())
        if state == "Z" and (comm in names or ppid in parents)
    ]


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
        "up", help="build if needed, start everything, wait for the node to be Ready"
    )
    commands.add_parser("down", help="stop everything and clean the host")
    commands.add_parser("status", help="each component, the node and its allocatable")
    restart_parser = commands.add_parser("restart", help="stop and start one component")
    restart_parser.add_argument("component", choices=STOP_ORDER)
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        if args.command == "up":  # name the missing packages too, so one sudo session does it
            subprocess.run([str(REPO / "e2e" / "host-packages.sh"), "--check", *PACKAGE_GROUPS])
        print("cluster: needs root (mounts, network, containerd, the kubelet)", file=sys.stderr)
        return 2
    try:
        if args.command == "up":
            up()
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
