"""The kubelet's plugin registration for the DRA driver: `pluginregistration.Registration` on
`<kubelet-root>/plugins_registry/<driver>-reg.sock`.

The kubelet's plugin watcher finds the socket, calls GetInfo (type `DRAPlugin`, the driver name,
the absolute path of the DRA socket, and the DRA services served there), dials that endpoint and
reports the outcome with NotifyRegistrationStatus. It takes the first DRA service of
`supported_versions` it knows, so the newest goes first, and, where its ResourceHealthStatus gate
is on, the first health service it knows (1.37+ know v1 and v1alpha1, 1.31 to 1.36 v1alpha1
only); a kubelet ignores the entries it does not know. Removing the socket deregisters the
driver, so the socket is created only once the DRA socket serves, and removed on stop (while it
is still ours: `owns_socket` tells it from a file or socket put in its place).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from deviceplugin.model.errors import ConfigError
from deviceplugin.model.log import log_event
from deviceplugin.node.unixgrpc import SocketPathError, UnixServer
from deviceplugin.wire.pluginregistration.v1 import api_pb2, api_pb2_grpc

logger = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"
# "<gRPC package's last part>.<service>", as k8s.io/kubelet/pkg/apis/dra/*/types.go and
# dra-health/*/types.go name them, newest first.
DRA_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
HEALTH_SERVICES = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")
SUPPORTED_SERVICES = DRA_SERVICES + HEALTH_SERVICES
REGISTRY_DIR = "plugins_registry"
PLUGINS_DIR = "plugins"
DRA_SOCKET_NAME = "dra.sock"


def registration_socket(kubelet_root: Path, driver: str) -> Path:
    """`<kubelet-root>/plugins_registry/<driver>-reg.sock`."""
    return kubelet_root / REGISTRY_DIR / f"{driver}-reg.sock"


def plugin_dir(kubelet_root: Path, driver: str) -> Path:
    """`<kubelet-root>/plugins/<driver>`: the DRA socket and the checkpoint live here."""
    return kubelet_root / PLUGINS_DIR / driver


def dra_socket(kubelet_root: Path, driver: str) -> Path:
    """`<kubelet-root>/plugins/<driver>/dra.sock`: the DRA and health services."""
    return plugin_dir(kubelet_root, driver) / DRA_SOCKET_NAME


class RegistrationServer(api_pb2_grpc.RegistrationServicer):
    """Answers the plugin watcher for one driver. `on_status(registered, error)` is called for
    every NotifyRegistrationStatus (the root re-publishes slices after a registration, since the
    kubelet wipes them while no plugin is registered)."""

    def __init__(
        self,
        driver: str,
        endpoint: Path,
        socket: Path,
        on_status: Callable[[bool, str], None] | None = None,
    ) -> None:
        self.driver = driver
        self.endpoint = endpoint
        self.registered = False
        self._on_status = on_status
        self._unix = UnixServer(socket, beside_others=True)

    @property
    def socket(self) -> Path:
        """The registration socket bound (beside another instance's during an update)."""
        return self._unix.socket

    @property
    def owns_socket(self) -> bool:
        """The socket path is still the socket this server bound (not deleted, not replaced)."""
        return self._unix.owns_socket

    async def start(self) -> None:
        """Listen on the registration socket (whatever is at the path is replaced). A path too
        long for a unix socket is a ConfigError of --kubelet-root."""
        self.socket.parent.mkdir(parents=True, exist_ok=True)
        try:
            await self._unix.start(
                lambda server: api_pb2_grpc.add_RegistrationServicer_to_server(self, server)
            )
        except SocketPathError as err:
            raise ConfigError("--kubelet-root", str(err)) from None

    async def stop(self, grace: float = 0.5) -> None:
        """Stop serving and remove the socket (if it still is ours), which deregisters the
        driver."""
        await self._unix.stop(grace)
        self.registered = False

    async def GetInfo(
        self, request: api_pb2.InfoRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.PluginInfo:
        return api_pb2.PluginInfo(
            type=PLUGIN_TYPE,
            name=self.driver,
            endpoint=str(self.endpoint),
            supported_versions=list(SUPPORTED_SERVICES),
        )

    async def NotifyRegistrationStatus(
        self, request: api_pb2.RegistrationStatus, context: grpc.aio.ServicerContext[Any, Any]
    ) -> api_pb2.RegistrationStatusResponse:
        self.registered = request.plugin_registered
        if request.plugin_registered:
            log_event(logger, "dra.registered", driver=self.driver, endpoint=str(self.endpoint))
        else:
            log_event(
                logger,
                "dra.registration.refused",
                logging.ERROR,
                driver=self.driver,
                error=request.error,
            )
        if self._on_status is not None:
            self._on_status(request.plugin_registered, request.error)
        return api_pb2.RegistrationStatusResponse()
