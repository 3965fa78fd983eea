"""What a running plugin reports about itself: the basis of /readyz, /status and inspect."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from deviceplugin.resources import ResourceSet


@dataclass(frozen=True)
class Status:
    """What /readyz and inspect report about the running plugin."""

    resources: Mapping[str, ResourceSet]
    registered: frozenset[str]
    health_monitor_alive: bool
    nvml_available: bool
    kubelet_restarting: bool
    config_source: str | None
    last_config_error: str | None
    started: bool = True

    @property
    def ready(self) -> bool:
        if not self.started:
            return False
        everything = set(self.resources) <= self.registered
        monitored = self.health_monitor_alive or not self.nvml_available or not self.resources
        return everything and monitored and not self.kubelet_restarting
