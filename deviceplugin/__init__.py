"""deviceplugin: a Kubernetes device plugin for NVIDIA GPUs, MIG devices and time-sliced
replicas."""

__version__ = "0.1.0"
