"""The cluster's identities: a CA, the API server's and each kubelet's serving certificates, a
client certificate and a kubeconfig per client (each kubelet its node's, `system:node:<name>`, so
the Node authorizer and NodeRestriction hold it to its own node), the service-account key pair
(openssl, made once and kept until `down`), and a GET as the admin for readiness checks."""

from __future__ import annotations

import json
import ssl
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from e2e.cluster.layout import API_PORT, API_SERVICE_IP, FIRST, NODE_IP, NODE_NAME, PKI, RUN, Node
from e2e.cluster.shell import run

CLIENTS = {
    "admin": "/O=system:masters/CN=kubernetes-admin",
    "apiserver-kubelet-client": "/O=system:masters/CN=kube-apiserver-kubelet-client",
    "controller-manager": "/CN=system:kube-controller-manager",
    "scheduler": "/CN=system:kube-scheduler",
}


def openssl(*args: str | Path) -> None:
    run(["openssl", *args])


def make_pki(nodes: Sequence[Node] = (FIRST,)) -> None:
    """A CA, the API server's serving certificate, a client certificate per identity and the
    service-account key pair, made once and kept until `down`; and each node's kubelet
    identity."""
    if not (PKI / "done").exists():
        make_control_plane_pki()
    for node in nodes:
        if not (PKI / f"{node.kubelet}.crt").exists():
            node_identity(node)


def node_identity(node: Node) -> None:
    """The node's kubelet: a client certificate as `system:node:<name>` in `system:nodes`, and a
    serving certificate for its address."""
    certificate(
        f"{node.kubelet}-serving",
        f"/CN={node.name}",
        f"DNS:{node.name},IP:{node.ip},IP:127.0.0.1",
        "serverAuth",
    )
    certificate(node.kubelet, f"/O=system:nodes/CN=system:node:{node.name}", "", "clientAuth")


def make_control_plane_pki() -> None:
    """Everything but the kubelets': the CA first, `done` last."""
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
    for name, subject in CLIENTS.items():
        certificate(name, subject, "", "clientAuth")
    (PKI / "done").touch()


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
