"""Registration with the kubelet: one Register call per resource, retried with backoff.

The kubelet (1.25+) dials the plugin back and calls GetDevicePluginOptions inside Register, so a
server must already be serving when `register` is called. Errors come back as gRPC status
`Unknown` with the kubelet's text; they are raised as RegistrationError carrying that text.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

import grpc

from deviceplugin.kubelet.server import OPTIONS
from deviceplugin.model.errors import RegistrationError
from deviceplugin.model.log import log_event
from deviceplugin.wire.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc

logger = logging.getLogger(__name__)

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
REGISTER_TIMEOUT = 5.0  # seconds for one Register, the kubelet's dial-back included
FIRST_RETRY_DELAY = 0.1  # then doubling, up to
MAX_RETRY_DELAY = 5.0


def pod_resources_socket(kubelet_dir: Path) -> Path:
    """`<kubelet-dir>/../pod-resources/kubelet.sock`: the kubelet's own path for the default
    `/var/lib/kubelet/device-plugins`, and a sibling of any other directory (tests, demo). Here,
    beside `kubelet.sock`, so `serve` can look for it without loading the PodResources client."""
    return kubelet_dir.parent / "pod-resources" / KUBELET_SOCKET


async def register(
    kubelet_dir: Path, endpoint: str, resource: str, sent: Callable[[], None] | None = None
) -> None:
    """Register `resource`, served on `<kubelet_dir>/<endpoint>`, with the kubelet once. `sent`
    is called once the call is under way, before the kubelet answers."""
    socket = kubelet_dir / KUBELET_SOCKET
    if not socket.exists():
        raise RegistrationError(f"kubelet socket {socket} does not exist")
    request = api_pb2.RegisterRequest(
        version=API_VERSION, endpoint=endpoint, resource_name=resource, options=OPTIONS
    )
    try:
        async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
            stub = api_pb2_grpc.RegistrationStub(channel)
            call = stub.Register(request, timeout=REGISTER_TIMEOUT, wait_for_ready=False)
            if sent is not None:
                sent()
            await call
    except grpc.aio.AioRpcError as exc:
        raise RegistrationError(
            f"kubelet refused {resource}: {exc.code().name}: {exc.details()}"
        ) from None


async def register_until_done(
    kubelet_dir: Path,
    endpoint: str,
    resource: str,
    on_failure: Callable[[], None] | None = None,
    sent: Callable[[], None] | None = None,
) -> int:
    """Register, retrying with exponential backoff until the kubelet accepts; returns attempts.

    Runs until it succeeds or is cancelled: a kubelet that is down now is expected back.
    `on_failure` is called after each failed attempt (the registration-failure metric), `sent`
    once each attempt's call is under way.
    """
    delay = FIRST_RETRY_DELAY
    attempt = 0
    while True:
        attempt += 1
        try:
            await register(kubelet_dir, endpoint, resource, sent)
            return attempt
        except RegistrationError as exc:
            level = logging.WARNING if attempt in (1, 10) or attempt % 50 == 0 else logging.DEBUG
            log_event(
                logger,
                "kubelet.register.failed",
                level,
                resource=resource,
                attempt=attempt,
                retry_in=round(delay, 2),
                error=str(exc),
            )
            if on_failure is not None:
                on_failure()
        await asyncio.sleep(delay)
        delay = min(MAX_RETRY_DELAY, delay * 2)
