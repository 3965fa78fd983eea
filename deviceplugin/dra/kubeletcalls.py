"""Which versions of its services the kubelet actually calls: `v1.DRAPlugin` or
`v1beta1.DRAPlugin`, `v1.DRAResourceHealth` or `v1alpha1.DRAResourceHealth`.

Both versions of each are served on the DRA socket, and the kubelet picks one by its own version
(1.34+ prefer v1 DRAPlugin; only 1.37+ know v1 DRAResourceHealth) and its gates (no health
stream at all without `ResourceHealthStatus`). Which one a node's kubelet uses is therefore a
fact of that node, seen only here: `/status` shows it (`kubelet_api`) and the first call of each
is logged (`dra.kubelet.api`).
"""

from __future__ import annotations

import logging
import time
from types import ModuleType
from typing import Any

from deviceplugin.model.log import log_event

logger = logging.getLogger(__name__)


def service_name(messages: ModuleType, service: str) -> str:
    """`v1beta1.DRAPlugin` for a service of the generated messages of one proto package."""
    return f"{messages.DESCRIPTOR.package.rsplit('.', 1)[-1]}.{service}"


class KubeletCalls:
    """Per service version: how many calls (streams, for health) and when the latest began."""

    def __init__(self) -> None:
        self._calls: dict[str, int] = {}
        self._latest: dict[str, float] = {}

    def called(self, service: str) -> None:
        """Count one call; the first of each service version is logged."""
        if service not in self._calls:
            log_event(logger, "dra.kubelet.api", service=service)
        self._calls[service] = self._calls.get(service, 0) + 1
        self._latest[service] = time.time()

    def document(self) -> dict[str, dict[str, Any]]:
        """The /status `kubelet_api`: `{"v1.DRAPlugin": {"calls": 3, "latest": 1765000000.0}}`."""
        return {
            service: {"calls": calls, "latest": round(self._latest[service], 3)}
            for service, calls in sorted(self._calls.items())
        }
