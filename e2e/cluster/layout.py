"""Where the single-node cluster keeps its files and which names and addresses it uses: shared by
every step of `cluster` (node.py) and nothing else. Nothing leaves the machine: the control plane
listens on 127.0.0.1, pods sit on the bridge `dpe2e0` that also carries the node's address."""

from __future__ import annotations

import os
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
