"""What a running DRA driver reports about itself: the basis of its /readyz, /status and gauges."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from deviceplugin.model.record import record
from deviceplugin.ops.corestatus import CoreStatus


@record(frozen=True)
class Pool:
    """This node's pool as last written to the API server (or adopted there after a restart)."""

    generation: int
    slices: int
    devices: int


@record(frozen=True)
class CheckpointUnusable:
    """Checkpoints found unusable since start: the driver went on from its own state, and each
    file was moved aside for an operator instead of being overwritten."""

    count: int
    error: str  # the latest one's
    set_aside: str  # where it went; "" when it could not be moved (then nothing is saved)


@record(frozen=True)
class DraStatus:
    """The driver's state now; `not_ready` says what keeps it from being ready."""

    core: CoreStatus
    driver: str
    node: str
    idle: bool  # NVML unavailable with failOnInitError false: nothing published or registered
    plugin_watcher: bool  # the kubelet's plugins_registry/ was there at start
    registered: bool
    serving: bool  # the DRA and registration sockets are in place
    pool: Pool | None  # None until the slices were written once
    api_error: str | None  # why the latest API request got no answer; None when it got one
    prepared_claims: int
    device_plugin_conflict: str | None = None  # why nothing is published: a device plugin serves
    slice_watch_error: str | None = None  # why the watch of the slices is down; None when up
    write_refused: str | None = None  # the API server's refusal of the latest slice write
    checkpoint_unusable: CheckpointUnusable | None = None  # None: every read could be trusted
    foreign_mig_instances: tuple[str, ...] = ()  # dynamic MIG: instances this driver did not make
    # what device-plugin pods hold (withheld from the slices), each `Held.describe()`
    held_by_device_plugins: tuple[dict[str, str], ...] = ()
    held_unknown: str | None = None  # why that could not be read (nothing new published)
    # which gated slice fields the API server keeps (`ServerFeatures.document()`); None: no probe
    server_features: dict[str, Any] | None = None
    # what the flags ask that the server's gates keep it from publishing, each naming the gate
    features_missing: tuple[str, ...] = ()
    # which versions of the DRA and health services the kubelet called (`KubeletCalls.document`)
    kubelet_api: dict[str, dict[str, Any]] | None = None

    @property
    def not_ready(self) -> list[str]:
        """Why the driver is not ready; empty when it is. Ready means: registered with the
        kubelet's plugin watcher (only serving on both sockets where there is no watcher), the
        slices written once, an answer to the latest API request, no device plugin serving
        NVIDIA GPUs on the node (then the driver publishes nothing), what a departed device
        plugin's pods hold known, the API server known to keep the fields the flags need (dynamic
        MIG's counters, memory shares' consumable capacity), and the engine's own reasons (a
        dead health monitor). An idle driver is ready."""
        reasons = self.core.not_ready
        if not self.core.started or self.idle:
            return reasons
        if not self.serving:
            reasons.append("not serving: a socket is missing")
        elif self.plugin_watcher and not self.registered:
            reasons.append("not registered with the kubelet")
        if self.pool is None:
            reasons.append("slices not published yet")
        if self.api_error:
            reasons.append(self.api_error)
        if self.write_refused:
            reasons.append(f"slice writes refused: {self.write_refused}")
        if self.device_plugin_conflict:
            reasons.append(self.device_plugin_conflict)
        if self.held_unknown:
            reasons.append(self.held_unknown)
        reasons.extend(self.features_missing)
        return reasons

    def document(self) -> dict[str, Any]:
        """The /status JSON."""
        pool, unusable = self.pool, self.checkpoint_unusable
        return {
            "live": True,
            "ready": not self.not_ready,
            "not_ready": self.not_ready,
            "driver": self.driver,
            "node": self.node,
            "idle": self.idle,
            "registered": self.registered,
            "pool": None if pool is None else asdict(pool),
            "api_error": self.api_error,
            "slice_watch_error": self.slice_watch_error,
            "write_refused": self.write_refused,
            "device_plugin_conflict": self.device_plugin_conflict,
            "prepared_claims": self.prepared_claims,
            "foreign_mig_instances": list(self.foreign_mig_instances),
            "held_by_device_plugins": list(self.held_by_device_plugins),
            "held_unknown": self.held_unknown,
            "server_features": self.server_features,
            "kubelet_api": self.kubelet_api or {},
            "checkpoint": {
                "unusable": unusable.count if unusable else 0,
                "last_error": unusable.error if unusable else None,
                "set_aside": unusable.set_aside if unusable else None,
            },
            "unhealthy": dict(self.core.unhealthy),
            "config": self.core.config_document(),
        }
