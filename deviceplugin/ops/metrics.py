"""Prometheus metrics, all under the `deviceplugin_` prefix, in a registry of their own.

One `Metrics` object per running plugin (`ops.drametrics.DraMetrics` per DRA driver; both share
`SharedMetrics`). The supervisor, the servers, the registrar and the health monitor call its
small methods through observer protocols of their own, so no other module touches
prometheus-client and none of them imports this one. Names and labels are documented in
docs/observability.md.

Nobody reads the metrics of a daemon without `--http-address`: it gets `NoMetrics` (the DRA
driver `NoDraMetrics`), whose methods do nothing, and prometheus-client (3 MiB, 13 ms to
import) is imported only when a registry is made.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from deviceplugin import __version__

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from deviceplugin.model.assignments import PodDevices
    from deviceplugin.model.resources import ResourceSet

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class SharedMetrics:
    """What the device plugin and the DRA driver both report: the build, NVML health events and
    config reloads. Each one's metrics extend these, in a registry of their own."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Info

        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.health_events = Counter(
            "deviceplugin_health_events",
            "NVML health events by Xid and the action taken.",
            ["xid", "action"],
            registry=r,
        )
        self.config_reloads = Counter(
            "deviceplugin_config_reloads",
            "Config reloads by result (applied, unchanged, rejected).",
            ["result"],
            registry=r,
        )
        self.config_last_reload_successful = Gauge(
            "deviceplugin_config_last_reload_successful",
            "1 when the config file's content in force is its latest content; 0 while the "
            "latest content is rejected and the last good config keeps serving.",
            registry=r,
        )
        self.config_last_reload_successful.set(1)
        self.node_config_label_valid = Gauge(
            "deviceplugin_node_config_label_valid",
            "1 when the node's nvidia.com/device-plugin.config label names a config that exists"
            " (or the node has none); 0 while it names one that does not and the last good"
            " config keeps serving.",
            registry=r,
        )
        self.node_config_label_valid.set(1)
        self.api_writes_refused = Counter(
            "deviceplugin_api_writes_refused",
            "API writes the API server refused (403: RBAC or an admission policy such as the"
            " chart's own-node policies), by resource.",
            ["resource"],
            registry=r,
        )
        self.build = Info(
            "deviceplugin_build", "Plugin version and NVML driver version.", registry=r
        )
        self.build.info({"version": __version__, "driver_version": ""})

    def set_driver_version(self, driver_version: str) -> None:
        self.build.info({"version": __version__, "driver_version": driver_version})

    def health_event(self, xid: str, action: str) -> None:
        self.health_events.labels(xid=xid, action=action).inc()

    def config_reloaded(self, result: str) -> None:
        """One reload of the config file: applied, unchanged or rejected."""
        self.config_reloads.labels(result).inc()

    def api_write_refused(self, resource: str) -> None:
        """One write the API server refused (`KubeError.refused`)."""
        self.api_writes_refused.labels(resource).inc()

    def config_in_force(self, latest: bool) -> None:
        """Whether the config file's latest content is the one in force."""
        self.config_last_reload_successful.set(1 if latest else 0)

    def config_label_valid(self, valid: bool) -> None:
        """Whether the node's config label names a config that exists (or there is none)."""
        self.node_config_label_valid.set(1 if valid else 0)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


class Metrics(SharedMetrics):
    """The device plugin's metrics; cheap to call from the event loop."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        super().__init__(registry)
        r = self.registry
        self.devices = Gauge(
            "deviceplugin_devices",
            "Devices advertised per resource and health state.",
            ["resource", "health"],
            registry=r,
        )
        self.registrations = Counter(
            "deviceplugin_registrations",
            "Successful Register calls to the kubelet, first and repeated.",
            ["resource", "kind"],
            registry=r,
        )
        self.registration_failures = Counter(
            "deviceplugin_registration_failures",
            "Register calls the kubelet refused or did not answer.",
            ["resource"],
            registry=r,
        )
        self.rpc_requests = Counter(
            "deviceplugin_rpc_requests",
            "Allocate and GetPreferredAllocation calls by outcome.",
            ["resource", "method", "outcome"],
            registry=r,
        )
        self.rpc_seconds = Histogram(
            "deviceplugin_rpc_duration_seconds",
            "Time to answer Allocate and GetPreferredAllocation.",
            ["resource", "method"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.kubelet_restarts = Counter(
            "deviceplugin_kubelet_restarts",
            "Kubelet restarts seen (kubelet.sock re-created or a plugin socket removed).",
            registry=r,
        )
        self.allocated = Gauge(
            "deviceplugin_allocated_device",
            "1 for each device ID a container holds, per the kubelet's pod-resources API.",
            ["resource", "device", "physical", "gpu", "namespace", "pod", "container"],
            registry=r,
        )
        self.held_by_dra = Gauge(
            "deviceplugin_devices_held_by_dra",
            "Device IDs advertised Unhealthy because prepared DRA claims hold their GPU or MIG"
            " device (PodResources dynamic_resources), per resource.",
            ["resource"],
            registry=r,
        )

    def set_resources(self, resources: Mapping[str, ResourceSet]) -> None:
        """Publish device counts per resource and health; resources that went away read 0."""
        self.devices.clear()
        for name, resource in resources.items():
            healthy = resource.healthy_count
            self.devices.labels(name, "Healthy").set(healthy)
            self.devices.labels(name, "Unhealthy").set(len(resource.devices) - healthy)

    def set_held_by_dra(
        self, resources: Mapping[str, ResourceSet], held: Mapping[str, Mapping[str, str]]
    ) -> None:
        """Publish how many IDs of each resource prepared DRA claims hold (`held`: resource ->
        ID -> why); resources that went away read 0."""
        self.held_by_dra.clear()
        for name in resources:
            self.held_by_dra.labels(name).set(len(held.get(name, ())))

    def set_allocated(self, pods: PodDevices | None, resources: Mapping[str, ResourceSet]) -> None:
        """Publish who holds which of our devices, with the physical device and parent GPU
        behind each ID; None (assignments unknown) publishes nothing rather than stale rows."""
        self.allocated.clear()
        if pods is None:
            return
        for name, resource in resources.items():
            for device in resource.devices:
                for holder in pods.holders(name, device.id):
                    self.allocated.labels(
                        name,
                        device.id,
                        device.physical_uuid,
                        device.gpu_uuid,
                        holder.namespace,
                        holder.pod,
                        holder.container,
                    ).set(1)

    def registered(self, resource: str, again: bool) -> None:
        self.registrations.labels(resource, "again" if again else "first").inc()

    def registration_failed(self, resource: str) -> None:
        self.registration_failures.labels(resource).inc()

    def kubelet_restarted(self) -> None:
        self.kubelet_restarts.inc()

    def rpc_done(self, resource: str, method: str, seconds: float, ok: bool) -> None:
        self.rpc_requests.labels(resource, method, "ok" if ok else "error").inc()
        self.rpc_seconds.labels(resource, method).observe(seconds)


class NoSharedMetrics(SharedMetrics):
    """The shared metrics of a daemon that serves no /metrics: every call does nothing, and no
    registry is made (prometheus-client stays unloaded)."""

    def __init__(self) -> None:  # no registry, no prometheus-client
        pass

    def set_driver_version(self, driver_version: str) -> None:
        pass

    def health_event(self, xid: str, action: str) -> None:
        pass

    def config_reloaded(self, result: str) -> None:
        pass

    def api_write_refused(self, resource: str) -> None:
        pass

    def config_in_force(self, latest: bool) -> None:
        pass

    def config_label_valid(self, valid: bool) -> None:
        pass

    def render(self) -> bytes:
        return b""


class NoMetrics(NoSharedMetrics, Metrics):
    """The metrics of a plugin that serves no /metrics, so Allocate does not pay for a
    histogram nobody reads."""

    def set_resources(self, resources: Mapping[str, ResourceSet]) -> None:
        pass

    def set_held_by_dra(
        self, resources: Mapping[str, ResourceSet], held: Mapping[str, Mapping[str, str]]
    ) -> None:
        pass

    def set_allocated(self, pods: PodDevices | None, resources: Mapping[str, ResourceSet]) -> None:
        pass

    def registered(self, resource: str, again: bool) -> None:
        pass

    def registration_failed(self, resource: str) -> None:
        pass

    def kubelet_restarted(self) -> None:
        pass

    def rpc_done(self, resource: str, method: str, seconds: float, ok: bool) -> None:
        pass
