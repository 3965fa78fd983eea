"""One GPU, one owner: the DRA driver stands aside on a node where a device plugin serves NVIDIA
resources.

The kubelet hands a device plugin's `nvidia.com/gpu` and the DRA driver's claims out
independently, so a node running both would give the same GPU to two pods. The rule is the
reference NVIDIA driver's, one or the other, decided per node: the device plugin already there
wins, since pods may hold its devices, and the DRA driver publishes no device while any
`nvidia-*.sock` in the kubelet's device-plugins directory accepts a connection (this project's
plugin and the reference plugin both name their sockets so). A socket file left by a killed
plugin refuses connections and does not count. Removing the device plugin from the node is
enough: the driver notices within seconds and publishes.
"""

from __future__ import annotations

from pathlib import Path

from deviceplugin.node.unixgrpc import listening

DEVICE_PLUGIN_SOCKETS = "nvidia-*.sock"
CONNECT_TIMEOUT_SECONDS = 0.5


def live_device_plugins(device_plugins_dir: Path) -> tuple[str, ...]:
    """The names of the NVIDIA device-plugin sockets in `device_plugins_dir` that a server is
    listening on, sorted; empty when the directory is missing or unreadable."""
    try:
        candidates = sorted(device_plugins_dir.glob(DEVICE_PLUGIN_SOCKETS))
    except OSError:
        return ()
    return tuple(path.name for path in candidates if listening(path, CONNECT_TIMEOUT_SECONDS))


def conflict_message(sockets: tuple[str, ...], device_plugins_dir: Path) -> str:
    return (
        f"a device plugin serves NVIDIA GPUs on this node ({', '.join(sockets)} in "
        f"{device_plugins_dir}): the DRA driver publishes no device here, so no GPU is handed "
        "out twice; remove the device plugin from this node to hand its GPUs to DRA"
    )
