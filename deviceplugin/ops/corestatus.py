"""What both daemons report about the node engine: part of each /status and /readyz, so the
device plugin and the DRA driver give the same reasons for the same state."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from deviceplugin.model.record import record


@record(frozen=True)
class CoreStatus:
    """The engine's state: start-up, the config in force and its source, NVML, health."""

    started: bool
    config_source: str | None
    last_config_error: str | None  # why the file's latest content was refused; None if it wasn't
    last_config_error_field: str | None  # the field last_config_error names, "" for none
    config_selection: Mapping[str, Any] | None  # with --config-dir: the node's config
    nvml_available: bool
    monitoring: bool  # there are devices the health monitor must watch
    health_monitor_alive: bool
    unhealthy: Mapping[str, str]  # UUID -> reason

    @property
    def not_ready(self) -> list[str]:
        """The engine's reasons not to be ready: still starting, or devices no health monitor
        watches (an Xid would go unnoticed). A refused config file is not one: serving the last
        good config is healthy."""
        if not self.started:
            return ["starting"]
        if self.monitoring and self.nvml_available and not self.health_monitor_alive:
            return ["health monitor not running"]
        return []

    def config_document(self) -> dict[str, Any]:
        """The `config` part of /status."""
        return {
            "source": self.config_source or "defaults",
            "last_error": self.last_config_error,
            "last_error_field": self.last_config_error_field,
            "selection": self.config_selection,
        }
