"""The DRA driver's Prometheus metrics: `deviceplugin_dra_*`, beside the shared ones.

The slice publisher reports each attempt to write the pool (`publish_done`) and each repair
of what another client changed (`slices_repaired`), and the root each
kubelet call (`claims_done`) and, for each claim Prepare could not prepare, why
(`prepare_failed`); the gauges, and the count of unusable checkpoints, are set from the
driver's status when /metrics is scraped (`set_status`), so they never lag behind it. Names and
labels are documented in docs/observability.md. A driver without `--http-address` gets
`NoDraMetrics`, and prometheus-client stays unloaded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from deviceplugin.ops.metrics import NoSharedMetrics, SharedMetrics

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from deviceplugin.ops.drastatus import DraStatus

# A publish writes up to a few slices (about 0.4 s for 448 devices); a Prepare that reads a
# claim from a slow API server can take seconds.
_SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class DraMetrics(SharedMetrics):
    """The DRA driver's metrics; cheap to call from the event loop."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        super().__init__(registry)
        r = self.registry
        self.slices = Gauge(
            "deviceplugin_dra_slices",
            "ResourceSlices of this node's pool, as last written to the API server.",
            registry=r,
        )
        self.devices = Gauge(
            "deviceplugin_dra_devices",
            "Devices in this node's ResourceSlices, as last written to the API server.",
            registry=r,
        )
        self.generation = Gauge(
            "deviceplugin_dra_pool_generation",
            "Generation of this node's pool, as last written to the API server.",
            registry=r,
        )
        self.publishes = Counter(
            "deviceplugin_dra_publishes",
            "Attempts to bring the node's ResourceSlices up to date, by outcome; retries count.",
            ["outcome"],
            registry=r,
        )
        self.publish_seconds = Histogram(
            "deviceplugin_dra_publish_duration_seconds",
            "Time of one attempt to bring the node's ResourceSlices up to date.",
            buckets=_SECONDS_BUCKETS,
            registry=r,
        )
        self.repairs = Counter(
            "deviceplugin_dra_slice_repairs",
            "Repairs of the node's ResourceSlices after another client deleted or changed them.",
            registry=r,
        )
        self.claims = Counter(
            "deviceplugin_dra_claims",
            "Claims the kubelet asked to prepare or unprepare, by method and outcome.",
            ["method", "outcome"],
            registry=r,
        )
        self.rpc_seconds = Histogram(
            "deviceplugin_dra_rpc_duration_seconds",
            "Time to answer the kubelet's NodePrepareResources and NodeUnprepareResources.",
            ["method"],
            buckets=_SECONDS_BUCKETS,
            registry=r,
        )
        self.prepare_failures = Counter(
            "deviceplugin_dra_prepare_failures",
            "Claims NodePrepareResources could not prepare, by reason.",
            ["reason"],
            registry=r,
        )
        self.checkpoints_unusable = Counter(
            "deviceplugin_dra_checkpoint_unusable",
            "Checkpoints found unusable (unreadable, damaged, a newer version) and set aside.",
            registry=r,
        )
        self._unusable_counted = 0
        self.prepared_claims = Gauge(
            "deviceplugin_dra_prepared_claims",
            "Claims prepared on this node (in the checkpoint).",
            registry=r,
        )
        self.foreign_mig_instances = Gauge(
            "deviceplugin_dra_foreign_mig_instances",
            "Dynamic MIG: GPU instances this driver did not create (left alone; the partitions "
            "they overlap are published tainted).",
            registry=r,
        )

        self.held = Gauge(
            "deviceplugin_dra_devices_held",
            "GPUs and MIG devices pods of a device plugin hold, per the kubelet's PodResources: "
            "withheld from the slices until their pods end.",
            registry=r,
        )

    def publish_done(self, seconds: float, ok: bool) -> None:
        self.publishes.labels("ok" if ok else "error").inc()
        self.publish_seconds.observe(seconds)

    def slices_repaired(self) -> None:
        self.repairs.inc()

    def claims_done(self, method: str, seconds: float, ok: int, failed: int) -> None:
        """One kubelet call: its duration, and how many of its claims succeeded and failed."""
        self.rpc_seconds.labels(method).observe(seconds)
        self.claims.labels(method, "ok").inc(ok)
        self.claims.labels(method, "error").inc(failed)

    def prepare_failed(self, reason: str) -> None:
        """One claim Prepare could not prepare, and why (`prepare.py`'s reasons)."""
        self.prepare_failures.labels(reason).inc()

    def set_status(self, status: DraStatus) -> None:
        """The gauges, from the driver's state now."""
        self.prepared_claims.set(status.prepared_claims)
        self.foreign_mig_instances.set(len(status.foreign_mig_instances))
        held = {(entry["gpu"], entry.get("mig")) for entry in status.held_by_device_plugins}
        self.held.set(len(held))
        unusable = status.checkpoint_unusable.count if status.checkpoint_unusable else 0
        self.checkpoints_unusable.inc(unusable - self._unusable_counted)
        self._unusable_counted = unusable
        pool = status.pool
        self.slices.set(pool.slices if pool else 0)
        self.devices.set(pool.devices if pool else 0)
        self.generation.set(pool.generation if pool else 0)


class NoDraMetrics(NoSharedMetrics, DraMetrics):
    """The metrics of a DRA driver that serves no /metrics: every call does nothing."""

    def publish_done(self, seconds: float, ok: bool) -> None:
        pass

    def slices_repaired(self) -> None:
        pass

    def claims_done(self, method: str, seconds: float, ok: int, failed: int) -> None:
        pass

    def prepare_failed(self, reason: str) -> None:
        pass

    def set_status(self, status: DraStatus) -> None:
        pass
