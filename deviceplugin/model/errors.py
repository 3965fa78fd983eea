"""The exception tree of the plugin; foreign errors are translated into it at the edges.

    DevicePluginError                 every error this package raises on purpose
    ├── ConfigError                   a config file or flag is invalid (carries the field path)
    ├── NvmlError                     NVML failed (raised only by nvml.py and the simulator seam)
    │   └── GpuLostError              NVML_ERROR_GPU_IS_LOST on one GPU
    ├── DiscoveryError                the node cannot be served as configured (e.g. for 'single')
    ├── AllocationError               a kubelet request names unknown or unhealthy IDs
    ├── RegistrationError             the kubelet refused or could not be reached
    └── PodResourcesError             the kubelet's pod-resources API did not answer List

Only `program` decides what an error means for the process (exit code, idle, retry), and only
`server.py` turns errors into gRPC status codes.
"""

from __future__ import annotations


class DevicePluginError(Exception):
    """Base of every error raised on purpose by this package."""


class ConfigError(DevicePluginError):
    """A configuration value is invalid; `path` names the field, e.g. `flags.migStrategy`."""

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        self.message = message
        super().__init__(f"{path}: {message}" if path else message)


class NvmlError(DevicePluginError):
    """An NVML call failed; `code` is the NVML return code when known."""

    def __init__(self, message: str, code: int | None = None) -> None:
        self.code = code
        super().__init__(message)


class GpuLostError(NvmlError):
    """The GPU fell off the bus (NVML_ERROR_GPU_IS_LOST)."""


class DiscoveryError(DevicePluginError):
    """The devices on this node cannot be turned into resources as configured."""


class AllocationError(DevicePluginError):
    """A kubelet request cannot be honoured; the message names the offending IDs."""


class RegistrationError(DevicePluginError):
    """Registering with the kubelet failed."""


class PodResourcesError(DevicePluginError):
    """The kubelet's pod-resources socket exists but List failed (timeout, refused, denied)."""
