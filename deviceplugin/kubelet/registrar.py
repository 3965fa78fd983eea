"""Keeps every running server registered with the kubelet.

A new server is registered once, retried with backoff until the kubelet answers. A kubelet
restart — `kubelet.sock` re-created (a new inode), or one of our sockets deleted, which a new
kubelet does to every plugin socket — means serving again where our socket is gone and
registering everything again. "Gone" means the path is no longer the socket the server bound:
deleted, or replaced by a regular file or another socket (a path that merely exists would be
registered and never dialled). While `kubelet.sock` is absent the kubelet is down: the plugin is
not ready, and the socket's return triggers the re-registration.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from deviceplugin.kubelet.registration import KUBELET_SOCKET, register_until_done
from deviceplugin.kubelet.server import PluginServer
from deviceplugin.model.log import log_event

logger = logging.getLogger(__name__)

Identity = tuple[int, int]
KUBELET_UP = "kubelet.sock appeared"  # the kubelet was down (or not yet up): not a restart


class RegistrationObserver(Protocol):
    """Receives registration outcomes (for metrics); every method must be cheap."""

    def registered(self, resource: str, again: bool) -> None: ...

    def registration_failed(self, resource: str) -> None: ...

    def kubelet_restarted(self) -> None: ...


class Registrar:
    """Registration state of this plugin's servers with one kubelet directory."""

    def __init__(self, kubelet_dir: Path, observer: RegistrationObserver) -> None:
        self._dir = kubelet_dir
        self._observer = observer
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._first_tries: dict[str, asyncio.Event] = {}  # set once its first Register is out
        self._registered: set[str] = set()
        self._identity = self._kubelet_identity()
        self._again: set[str] = set()  # registering again after a kubelet restart

    @property
    def registered(self) -> frozenset[str]:
        return frozenset(self._registered)

    @property
    def restarting(self) -> bool:
        """A kubelet restart is being handled, or the kubelet is down."""
        return bool(self._again) or self._identity is None

    def register(self, server: PluginServer, again: bool = False) -> None:
        """Register `server` in the background, retrying until the kubelet accepts it."""
        self.forget(server.name)
        if again:
            self._again.add(server.name)
        tried = self._first_tries[server.name] = asyncio.Event()
        self._tasks[server.name] = asyncio.get_running_loop().create_task(
            self._register(server, again, tried)
        )

    async def underway(self) -> None:
        """Until every registration begun has its first Register on the way to the kubelet (or
        failed to send it). The kubelet dials back inside Register: a wait the rest of a start-up
        can use, once no Register waits for it."""
        await asyncio.gather(*(tried.wait() for tried in self._first_tries.values()))

    def forget(self, name: str) -> None:
        """Stop registering `name` and drop it from the registered set."""
        task = self._tasks.pop(name, None)
        if task is not None:
            task.cancel()
        tried = self._first_tries.pop(name, None)
        if tried is not None:
            tried.set()  # nobody waits for a Register that will not be sent
        self._registered.discard(name)
        self._again.discard(name)

    def forget_all(self) -> None:
        for name in list(self._tasks) + list(self._registered):
            self.forget(name)

    def restart_needed(self, servers: Mapping[str, PluginServer]) -> str | None:
        """Why everything must be registered again now, or None. Also notes a kubelet that is
        down (kubelet.sock gone), which keeps the plugin unready until it returns."""
        identity = self._kubelet_identity()
        if identity is None:
            if self._identity is not None:
                log_event(logger, "kubelet.down", socket=str(self._dir / KUBELET_SOCKET))
                self._registered.clear()
            self._identity = None
            return None
        if identity != self._identity:
            first = self._identity is None
            self._identity = identity
            return KUBELET_UP if first else "kubelet.sock created"
        gone = sorted(n for n, s in servers.items() if s.serving and not s.owns_socket)
        return f"{gone[0]} socket removed or replaced" if gone else None

    async def reregister(self, servers: Mapping[str, PluginServer], trigger: str) -> None:
        """Serve again where our socket is gone or replaced, then register every server again."""
        if trigger != KUBELET_UP:
            self._observer.kubelet_restarted()
        log_event(logger, "kubelet.restarted", trigger=trigger)
        self.forget_all()
        self._again.update(servers)  # unready from now on, not only once the first Register starts
        for server in servers.values():
            if not server.owns_socket:
                await server.stop(0)
                await server.start()
            self.register(server, again=True)

    async def _register(self, server: PluginServer, again: bool, tried: asyncio.Event) -> None:
        name = server.name

        def failed() -> None:
            tried.set()
            self._observer.registration_failed(name)

        try:
            await register_until_done(
                self._dir, server.socket_path.name, name, on_failure=failed, sent=tried.set
            )
        finally:
            tried.set()  # an attempt that broke off unexpectedly holds up nobody either
        self._registered.add(name)
        self._tasks.pop(name, None)
        self._again.discard(name)
        self._observer.registered(name, again)
        resource = server.resource
        log_event(
            logger,
            "plugin.registered",
            resource=name,
            socket=server.socket_path.name,
            devices=len(resource.devices),
            healthy=resource.healthy_count,
        )

    def _kubelet_identity(self) -> Identity | None:
        """(inode, ctime) of kubelet.sock, to tell a re-created socket from the old one."""
        try:
            st = os.stat(self._dir / KUBELET_SOCKET)
        except OSError:
            return None
        return (st.st_ino, st.st_ctime_ns)
