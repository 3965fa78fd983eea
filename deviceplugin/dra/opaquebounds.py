"""How much of a claim's opaque configuration this driver reads: Kubernetes' own limits on an
allocation's config, checked before anything is built from it, so a claim written to be
expensive fails at once with the field's path instead of holding up the node's driver.

The API server keeps these limits too (64 config entries in an allocation, 32 requests per
entry, 10 KiB of parameters); the driver does not depend on it. A walk over the parameters
stops at the first bound it passes, so its cost is bounded whatever the claim holds."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from deviceplugin.dra.opaquetypes import OpaqueConfigError
from deviceplugin.model.quantity import MAX_MAGNITUDE

MAX_ENTRIES = 64  # AllocationResult.devices.config (AllocationConfigMaxSize)
MAX_REQUESTS = 32  # DeviceAllocationConfiguration.requests (DeviceRequestsMaxSize)
MAX_REQUEST_LENGTH = 127  # a DNS label, or `<request>/<subrequest>`
MAX_PARAMETERS = (
    10 * 1024
)  # OpaqueDeviceConfiguration.parameters as JSON (OpaqueParametersMaxLength)
MAX_DEPTH = 16  # the API nests four levels; room for what other versions may add
MAX_DEVICES = 32  # a claim's allocation results (AllocationResultsMaxSize)


def check_count(items: Sequence[object], most: int, path: str, what: str) -> None:
    """Refuse more than `most` items at `path`."""
    if len(items) > most:
        raise OpaqueConfigError(path, f"has {len(items)} {what}, more than the {most} allowed")


def check_requests(requests: object, path: str) -> tuple[str, ...]:
    """An entry's request names, each a bounded string."""
    if requests is None:
        return ()
    if not isinstance(requests, list):
        raise OpaqueConfigError(path, "must be a list of request names")
    check_count(requests, MAX_REQUESTS, path, "requests")
    for index, request in enumerate(requests):
        if not isinstance(request, str) or not 0 < len(request) <= MAX_REQUEST_LENGTH:
            raise OpaqueConfigError(
                f"{path}[{index}]",
                f"must be a request name of 1 to {MAX_REQUEST_LENGTH} characters",
            )
    return tuple(requests)


def check_parameters(parameters: object, path: str) -> None:
    """Refuse parameters larger than Kubernetes keeps as JSON, nested deeper than MAX_DEPTH, or
    holding an integer past 2^63-1 or a key that is not a string (the field named). Each node
    read adds to the size first, so the walk ends within MAX_PARAMETERS nodes."""
    size = 0
    stack: list[tuple[object, str, int]] = [(parameters, path, 0)]
    while stack:
        value, where, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise OpaqueConfigError(where, f"is nested deeper than {MAX_DEPTH} levels")
        size = _within(size + _json_size(value), path)
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_MAGNITUDE:
            raise OpaqueConfigError(where, "is out of range: a number is at most 2^63-1")
        if isinstance(value, Mapping):
            for key, child in value.items():
                if not isinstance(key, str):
                    raise OpaqueConfigError(where, "has a key that is not a string")
                size = _within(size + len(key), path)
                stack.append((child, f"{where}.{key}", depth + 1))
        elif isinstance(value, list):
            stack.extend((child, f"{where}[{i}]", depth + 1) for i, child in enumerate(value))


def _within(size: int, path: str) -> int:
    if size > MAX_PARAMETERS:
        raise OpaqueConfigError(
            path,
            f"is larger than {MAX_PARAMETERS // 1024} KiB as JSON, the most Kubernetes keeps"
            " for an opaque config",
        )
    return size


def _json_size(value: object) -> int:
    """The least a value takes as JSON, without its children's own (a mapping's keys are added
    as they are read): enough to bound the walk before a child is listed."""
    if isinstance(value, str):
        return len(value) + 2
    if isinstance(value, Mapping):  # braces, then quotes, colon and comma per member
        return 2 + 4 * len(value)
    if isinstance(value, list):  # brackets and commas
        return 2 + len(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return max(1, value.bit_length() * 3 // 10)  # its decimal digits, without writing them
    return 4  # true, null, a float's shortest
