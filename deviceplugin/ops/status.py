"""What a running plugin reports about itself: the basis of /readyz, /status and inspect."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from deviceplugin.model.record import record
from deviceplugin.model.resources import ResourceSet
from deviceplugin.ops.corestatus import CoreStatus


@record(frozen=True)
class Status:
    """What /readyz and inspect report about the running plugin: the engine's core, and the
    plugin's servers."""

    core: CoreStatus
    resources: Mapping[str, ResourceSet]
    registered: frozenset[str]
    kubelet_restarting: bool
    cdi_spec_error: str | None = None  # why the CDI spec could not be written; None when it was
    dra_holds: Mapping[str, Any] | None = None  # what prepared DRA claims withhold (`draholds`)

    @property
    def not_ready(self) -> list[str]:
        """Why the plugin is not ready; empty when it is. Before start-up has finished the plugin
        advertises nothing yet, which would otherwise read as "everything registered"."""
        reasons = self.core.not_ready
        if not self.core.started:
            return reasons
        missing = sorted(set(self.resources) - self.registered)
        if missing:
            reasons.insert(0, "not registered: " + ", ".join(missing))
        if self.kubelet_restarting:
            reasons.append("kubelet restart in progress")
        if self.cdi_spec_error:
            reasons.append(f"CDI spec not written: {self.cdi_spec_error}")
        return reasons

    @property
    def ready(self) -> bool:
        return not self.not_ready
