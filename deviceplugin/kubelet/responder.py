"""Binds the pure allocation code to the running config and inventory, and speaks protobuf.

One NodeAllocator is shared by every PluginServer; `configure` swaps config and inventory in
place on reload, so servers that keep running also pick up a new deviceListStrategy. The
preferred allocation never fails the kubelet's call: topology.py falls back to a simple choice.

An Allocate answer depends only on the resource set, the options and the host's device files,
all replaced (never changed) when they change, so answers are kept per request until then: the
kubelet asks again for the same IDs whenever a container restarts, and the answer is then a
lookup instead of validating, building and encoding it again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

from deviceplugin.model.allocation import AllocateOptions, ContainerResponse, allocate
from deviceplugin.model.config import Config, SharedDevicesAllocationPolicy
from deviceplugin.model.devices import Inventory
from deviceplugin.model.resources import ResourceSet
from deviceplugin.model.topology import index_for, preferred_allocation
from deviceplugin.node.hostdevices import HostDevices
from deviceplugin.wire.deviceplugin.v1beta1 import api_pb2

ANSWERS_KEPT = 1024  # distinct requests remembered; past that the memory starts again

Requests = tuple[tuple[str, ...], ...]


def to_proto(response: ContainerResponse) -> api_pb2.ContainerAllocateResponse:
    """The v1beta1 message for one container's response."""
    return api_pb2.ContainerAllocateResponse(
        envs=dict(response.envs),
        mounts=[
            api_pb2.Mount(
                container_path=m.container_path, host_path=m.host_path, read_only=m.read_only
            )
            for m in response.mounts
        ],
        devices=[
            api_pb2.DeviceSpec(
                container_path=d.container_path, host_path=d.host_path, permissions=d.permissions
            )
            for d in response.device_specs
        ],
        annotations=dict(response.annotations),
        cdi_devices=[api_pb2.CDIDevice(name=name) for name in response.cdi_devices],
    )


class NodeAllocator:
    """Allocate and GetPreferredAllocation for every resource of this node."""

    def __init__(
        self, config: Config, inventory: Inventory | None = None, host: HostDevices | None = None
    ) -> None:
        self._host = host or HostDevices()
        self._inventory = inventory or Inventory(gpus=())
        self._options = AllocateOptions.from_config(config)
        self._policy = config.flags.plugin.shared_devices_allocation_policy
        self._answers: dict[tuple[str, Requests], tuple[ResourceSet, api_pb2.AllocateResponse]] = {}

    def configure(self, options: AllocateOptions, policy: SharedDevicesAllocationPolicy) -> None:
        """Adopt the options of a new config (validated by the caller when it built them)."""
        self._options, self._policy = options, policy
        self._answers.clear()

    def use_inventory(self, inventory: Inventory) -> None:
        """Adopt a rediscovered inventory; host facts are read again on the next Allocate."""
        if inventory != self._inventory:
            self._inventory = inventory
            self._host.refresh()
            self._answers.clear()

    def prepare(self, resource: ResourceSet) -> None:
        """Index a new resource set for preferred allocation now, not on the kubelet's call.
        A failure is left for `preferred`, which falls back to a simple choice."""
        with contextlib.suppress(Exception):
            index_for(resource, self._inventory)

    def allocate(
        self, resource: ResourceSet, container_requests: Sequence[Sequence[str]]
    ) -> api_pb2.AllocateResponse:
        key = (resource.name, tuple(tuple(ids) for ids in container_requests))
        kept = self._answers.get(key)
        if kept is not None and kept[0] is resource:
            return kept[1]
        responses = allocate(resource, container_requests, self._options, self._host)
        answer = api_pb2.AllocateResponse(container_responses=[to_proto(r) for r in responses])
        if len(self._answers) >= ANSWERS_KEPT:
            self._answers.clear()
        self._answers[key] = (resource, answer)
        return answer

    def preferred(
        self,
        resource: ResourceSet,
        available: Sequence[str],
        must_include: Sequence[str],
        size: int,
    ) -> list[str]:
        return preferred_allocation(
            resource, self._inventory, available, must_include, size, self._policy
        )
