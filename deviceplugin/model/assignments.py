"""Which container holds which device ID: the kubelet's pod assignments as plain data.

The kubelet's PodResources API is read by the device-plugin front-end; metrics, /status and
`inspect` show the result. Keeping the shape here lets each of them depend on the data alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from deviceplugin.model.record import record


@record(frozen=True)
class PodDevice:
    """One device ID of one resource held by one container."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_id: str


class PodDevices:
    """Every device the kubelet reports as held, looked up by (resource, device ID).

    One ID can have several holders: the kubelet hands an init container's devices on to the
    later containers of the same pod.
    """

    def __init__(self, entries: Iterable[PodDevice]) -> None:
        self._index: dict[tuple[str, str], list[PodDevice]] = {}
        for entry in entries:
            self._index.setdefault((entry.resource, entry.device_id), []).append(entry)

    def holders(self, resource: str, device_id: str) -> tuple[PodDevice, ...]:
        return tuple(self._index.get((resource, device_id), ()))

    def __iter__(self) -> Iterator[PodDevice]:
        return (entry for entries in self._index.values() for entry in entries)


@record(frozen=True)
class ClaimDevice:
    """One device of a prepared ResourceClaim, as the kubelet reports it for a container."""

    namespace: str
    pod: str
    container: str
    claim: str  # `<namespace>/<name>`
    driver: str
    pool: str
    device: str


@record(frozen=True)
class PodResources:
    """One answer of the kubelet's PodResources `List`: device-plugin IDs and claims' devices."""

    devices: PodDevices
    claims: tuple[ClaimDevice, ...]
