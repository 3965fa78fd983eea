"""What a running plugin reports about itself: the basis of /readyz, /status and inspect."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from deviceplugin.model.record import record
from deviceplugin.model.resources import ResourceSet


@record(frozen=True)
class Status:
    """What /readyz and inspect report about the running plugin."""

    resources: Mapping[str, ResourceSet]
    registered: frozenset[str]
    health_monitor_alive: bool
    nvml_available: bool
    kubelet_restarting: bool
    config_source: str | None
    last_config_error: str | None  # why the file's latest content was refused; None when it wasn't
    started: bool
    cdi_spec_error: str | None = None  # why the CDI spec could not be written; None when it was
    last_config_error_field: str | None = None  # the field last_config_error names, "" for none
    # with --config-dir: the named config chosen for this node, why, and what is wrong if anything
    config_selection: Mapping[str, Any] | None = None

    @property
    def not_ready(self) -> list[str]:
        """Why the plugin is not ready; empty when it is. Before start-up has finished the plugin
        advertises nothing yet, which would otherwise read as "everything registered". A refused
        config file is not a reason: serving the last good config is healthy."""
        if not self.started:
            return ["starting"]
        reasons: list[str] = []
        missing = sorted(set(self.resources) - self.registered)
        if missing:
            reasons.append("not registered: " + ", ".join(missing))
        if self.resources and self.nvml_available and not self.health_monitor_alive:
            reasons.append("health monitor not running")
        if self.kubelet_restarting:
            reasons.append("kubelet restart in progress")
        if self.cdi_spec_error:
            reasons.append(f"CDI spec not written: {self.cdi_spec_error}")
        return reasons

    @property
    def ready(self) -> bool:
        return not self.not_ready
