"""Which pod holds which device, for the device plugin's /status, metrics and `inspect --pods`
(the PodResources client is `node/podresources.py`).

The IDs the kubelet reports are the IDs this plugin advertised, so a replica `<uuid>::<n>` or a
MIG UUID leads straight back to the hardware. The socket is optional (the DaemonSet must mount
the directory): an absent socket means "assignments unknown", never a failure of the plugin.
"""

from __future__ import annotations

from pathlib import Path

from deviceplugin.kubelet.registration import pod_resources_socket as pod_resources_socket
from deviceplugin.model.assignments import PodDevices
from deviceplugin.model.errors import PodResourcesError
from deviceplugin.node.podresources import list_pod_devices


async def read_pods(socket: Path) -> tuple[PodDevices | None, str]:
    """(assignments, "") or (None, why they are unknown): for callers that show a note
    instead of failing."""
    try:
        pods = await list_pod_devices(socket)
    except PodResourcesError as exc:
        return None, str(exc)
    if pods is None:
        return None, f"pod-resources socket {socket} not found: pod assignments unknown"
    return pods, ""
