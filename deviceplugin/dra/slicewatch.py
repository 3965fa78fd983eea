"""Follows this node's ResourceSlices on the API server, so that the publisher puts back at once
what someone else deleted or changed.

The kubelet deletes every ResourceSlice of its node when it starts, in the background and
retried until it succeeds, so the wipe can land after the driver has registered with the new
kubelet and repaired its slices; and it deletes a driver's slices when no plugin of it has
been registered for 30 s. An operator may delete or edit a slice too. Without a watch, such a
node would offer nothing to the scheduler until the driver's next own change.

How it runs: list the slices (`publisher.check` repairs them if they are not as written), then
watch from the list's resourceVersion, handing every change to `publisher.changed_on_server`,
which tells its own writes apart. The server ends a watch after about five minutes; a refused
or lost watch, or an expired resourceVersion (410), is tried again after a backoff that doubles
up to the publisher's cap, with a fresh list each time; so is anything unexpected, logged with
its traceback. `run` until cancelled.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Protocol

from deviceplugin.dra.publisher import Backoff, JsonObject, SlicePublisher
from deviceplugin.model.log import log_event
from deviceplugin.runtime.kubeclient import KubeError, Listed

logger = logging.getLogger(__name__)

SHORTEST_WATCH_SECONDS = 1.0  # a watch the server ends sooner counts as failed: no busy loop


class WatchApi(Protocol):
    async def list_slices(self, node: str, driver: str) -> Listed: ...
    def watch_slices(
        self, node: str, driver: str, since: str
    ) -> AsyncIterator[tuple[str, JsonObject]]: ...


class SliceWatch:
    """Lists, then watches, the slices `publisher` writes."""

    def __init__(
        self, api: WatchApi, publisher: SlicePublisher, backoff: Backoff | None = None
    ) -> None:
        self.error: str | None = None  # why the latest try to follow the slices failed
        self._api = api
        self._publisher = publisher
        self._backoff = backoff or Backoff()

    async def run(self) -> None:
        failures = 0
        while True:
            began = time.monotonic()
            try:
                await self._follow()
                if time.monotonic() - began >= SHORTEST_WATCH_SECONDS:
                    failures = 0  # ended as watches do: start again at once
                    continue
                self._failed("the server ended the watch at once")
            except KubeError as err:
                self._failed(str(err))
            except Exception as err:  # a surprise must not end the watch for good
                logger.exception("dra.slices.watch.error")
                self._failed(repr(err))
            failures += 1
            await asyncio.sleep(self._backoff.delay(failures))

    async def _follow(self) -> None:
        """One list and the watch that follows it, until the watch ends."""
        publisher = self._publisher
        node, driver = publisher.node_name, publisher.driver
        listed = await self._api.list_slices(node, driver)
        if self.error is not None:
            log_event(logger, "dra.slices.watch.restored", node=node)
            self.error = None
        publisher.check(listed.items)
        async for kind, item in self._api.watch_slices(node, driver, listed.version):
            publisher.changed_on_server(kind, item)

    def _failed(self, error: str) -> None:
        if self.error is None:  # once per outage, not once per retry
            log_event(
                logger,
                "dra.slices.watch.failed",
                logging.WARNING,
                node=self._publisher.node_name,
                error=error,
                retry="with backoff; the slices are still repaired after each registration",
            )
        self.error = error
