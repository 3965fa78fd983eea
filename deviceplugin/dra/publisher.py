"""Publishes this node's devices as `resource.k8s.io/v1` ResourceSlices, and keeps them so.

How to use it (the composition root does this):

    api = await kubeapi.connect(kubeconfig=settings.kubeconfig)  # or connect(host=stand_in.url)
    publisher = SlicePublisher(api, node_name="node-1", driver="gpu.nvidia.com")
    await publisher.publish(inventory, unhealthy)   # at start, and after every change
    await publisher.refresh()                       # after the kubelet (re-)registers the plugin
    await publisher.check(listed_items)             # a fresh list: repaired if not as written
    await publisher.changed_on_server(kind, item)   # a watched change: repaired if not ours
    ...
    await publisher.close()                         # stops retrying, closes the client

`inventory` is the node as discovery found it and `unhealthy` the health engine's UUID -> reason
(`model.slices` publishes the hardware as it is, whatever the device plugin's MIG strategy), and
`taint` (constructor) the effect of the taint an unhealthy device gets, or None for no taint.
Call `publish` again whenever the inventory or a device's health changes; calling it with an
unchanged state writes nothing.

What it guarantees:

- one pool per node (named after the node), cut into slices at the API's device limit, named
  `<node>-<driver>-<n>`; on any change the pool's generation is bumped and every slice of the
  pool rewritten (consumers use only the newest generation, so no slice may lag behind), slices
  no longer needed are deleted, and so are stale slices of this node and driver found at start;
- after a restart, slices that already say what this node has are adopted, not rewritten;
- a slice someone else deleted, changed or added is put back as written (`dra/slicewatch.py`
  hands over what the server says): the publisher tells its own writes from the watch by
  resourceVersion, so its own writes cost no second look. The first repair after a quiet
  minute is made at once; while repairs keep coming (another writer with other content, such
  as the other instance during a rolling update) each waits as a retry does, so two writers
  never fight at full speed;
- a taint keeps the `timeAdded` the API server gave it while the device stays tainted, so
  rewriting a slice never restarts a `NoExecute` toleration's countdown;
- an API error never escapes `publish`: it is logged (`dra.publish.failed`), the slices are
  listed afresh and the write retried with exponential backoff until it succeeds or a newer
  `publish` supersedes it. `publish` returns whether this call got the slices written;
  `wait_published()` waits until the newest state is on the server;
- every attempt that reaches the API server, retries included, is reported to the optional
  `observer` with its duration and outcome, and `written` says what the pool holds. A failed
  repair is retried as a failed publish is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from deviceplugin.model.devices import Inventory
from deviceplugin.model.log import log_event
from deviceplugin.model.record import record
from deviceplugin.model.slices import (
    DEFAULT_TAINT,
    DRIVER,
    TaintEffect,
    build_devices,
    build_slices,
)

logger = logging.getLogger(__name__)

REPAIR_QUIET_SECONDS = 60.0  # repairs this far apart are each made at once

JsonObject = dict[str, Any]


class SliceApi(Protocol):
    """The API calls the publisher makes (`kubeapi.KubeApi`; raises `KubeApiError`)."""

    async def list_slices(self, node: str, driver: str) -> tuple[list[JsonObject], str]: ...
    async def create_slice(self, body: JsonObject) -> JsonObject: ...
    async def replace_slice(self, name: str, body: JsonObject) -> JsonObject: ...
    async def delete_slice(self, name: str) -> None: ...
    async def close(self) -> None: ...


class PublishObserver(Protocol):
    """Told how each attempt that reached the API server went (for metrics); cheap, never
    raises."""

    def publish_done(self, seconds: float, ok: bool) -> None: ...
    def slices_repaired(self) -> None: ...


@record(frozen=True)
class Backoff:
    """Delays between retries after an API error: first, doubling, up to most."""

    first: float = 0.2
    most: float = 30.0

    def delay(self, failures: int) -> float:
        """The wait after `failures` failed attempts in a row (>= 1)."""
        return float(min(self.first * 2 ** max(failures - 1, 0), self.most))


class SlicePublisher:
    """Owns `api`: `close()` closes it."""

    def __init__(
        self,
        api: SliceApi,
        node_name: str,
        driver: str = DRIVER,
        backoff: Backoff | None = None,
        taint: TaintEffect | None = DEFAULT_TAINT,
        observer: PublishObserver | None = None,
    ) -> None:
        self.node_name = node_name
        self.driver = driver
        self.taint = taint
        self._api = api
        self._backoff = backoff or Backoff()
        self._observer = observer
        self._lock = asyncio.Lock()
        self._desired: list[JsonObject] = []  # the devices to publish
        self._version = 0  # bumped by every publish(); the retry loop chases the newest
        self._synced_version = -1
        self._stored: dict[str, JsonObject] | None = None  # slices on the server; None: re-list
        self._generation = 0
        self._written: list[tuple[str, Any]] | None = None  # contents of the last write
        self._failures = 0  # failed attempts in a row
        self._repairs = 0  # repairs since the last quiet minute
        self._last_repair = -REPAIR_QUIET_SECONDS
        self._retry: asyncio.Task[None] | None = None
        self._published = asyncio.Event()

    @property
    def generation(self) -> int:
        """The pool generation last written (or adopted)."""
        return self._generation

    @property
    def written(self) -> tuple[int, int] | None:
        """(slices, devices) of the pool as last written or adopted; None before the first."""
        if self._written is None:
            return None
        devices = sum(len(spec.get("devices") or []) for _, spec in self._written)
        return len(self._written), devices

    async def publish(self, inventory: Inventory, unhealthy: Mapping[str, str]) -> bool:
        """Make the slices say what `inventory` and `unhealthy` say; True once written."""
        self._desired = build_devices(inventory, unhealthy, self.driver, self.taint)
        self._version += 1
        self._published.clear()
        return await self._attempt()

    async def refresh(self) -> bool:
        """List the slices afresh and repair them: for when someone else may have changed or
        deleted them (the kubelet wipes a node's slices when it restarts or loses the plugin
        for 30 s, so call this after each registration). True once they say the newest state;
        False before the first publish, which has nothing to repair them with."""
        if self._version == 0:
            return False
        async with self._lock:
            self._stored = None
        return await self._attempt()

    async def check(self, found: Sequence[JsonObject]) -> None:
        """Repair the slices unless `found` (a fresh list of them) holds exactly the versions
        last written: one was deleted, changed or added while nobody watched."""
        async with self._lock:
            if self._stored is None or _versions(found) == _versions(self._stored.values()):
                return  # as written, or a sync that lists anyway is under way
            self._stored = None
        await self._repair("the listed slices are not the ones written")

    async def changed_on_server(self, kind: str, item: JsonObject) -> None:
        """A watch saw `item` ADDED, MODIFIED or DELETED: repair unless it is this publisher's
        own write."""
        async with self._lock:
            if self._stored is None or _own_change(self._stored, kind, item):
                return
            self._stored = None
        name = (item.get("metadata") or {}).get("name")
        await self._repair(f"ResourceSlice {name} {kind.lower()} by another client")

    async def wait_published(self) -> None:
        """Return once the newest state given to `publish` is on the server."""
        await self._published.wait()

    async def close(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._retry
            self._retry = None
        await self._api.close()

    # --- syncing --------------------------------------------------------------------------------

    async def _repair(self, reason: str) -> None:
        """Sync after a change by another client: at once, unless repairs keep coming."""
        now = time.monotonic()
        if now - self._last_repair >= REPAIR_QUIET_SECONDS:
            self._repairs = 0
        self._last_repair = now
        delay = self._backoff.delay(self._repairs) if self._repairs else 0.0
        self._repairs += 1
        log_event(logger, "dra.slices.repair", node=self.node_name, reason=reason, delay=delay)
        if self._observer is not None:
            self._observer.slices_repaired()
        await asyncio.sleep(delay)
        await self._attempt()

    async def _attempt(self, retry: bool = False) -> bool:
        """One sync of the newest state; on failure logs and makes sure a retry loop runs."""
        async with self._lock:
            version = self._version
            began = time.perf_counter()
            try:
                reached_api = await self._sync(self._desired)
            except Exception as err:  # the driver must outlive any API failure
                self._report(began, ok=False)
                self._stored = None
                self._synced_version = -1  # what the server holds is unknown: retry even a repair
                self._failures += 1
                log_event(
                    logger,
                    "dra.publish.failed",
                    logging.WARNING,
                    node=self.node_name,
                    error=str(err) or repr(err),
                    retry=retry,
                )
                if self._retry is None or self._retry.done():
                    self._retry = asyncio.get_running_loop().create_task(self._retry_loop())
                return False
            if reached_api:
                self._report(began, ok=True)
            self._synced_version = version
            self._failures = 0
            if version == self._version:
                self._published.set()
            return True

    def _report(self, began: float, ok: bool) -> None:
        if self._observer is not None:
            self._observer.publish_done(time.perf_counter() - began, ok)

    async def _retry_loop(self) -> None:
        """Retries until the newest state is written; a newer publish() may get there first."""
        while self._synced_version != self._version:
            await asyncio.sleep(self._backoff.delay(self._failures))
            if self._synced_version != self._version:
                await self._attempt(retry=True)

    async def _sync(self, devices: Sequence[JsonObject]) -> bool:
        """Bring the server's slices to `devices`; False when that needed no API call."""
        wanted = _contents(build_slices(self.node_name, devices, 0, self.driver))
        if self._stored is not None and wanted == self._written:
            return False  # nothing changed since the last write
        if self._stored is None:
            found, _ = await self._api.list_slices(self.node_name, self.driver)
            self._stored = {item["metadata"]["name"]: item for item in found}
            generations = {_generation(item) for item in found}
            if len(generations) == 1 and _contents(found) == wanted:
                self._generation, self._written = generations.pop(), wanted
                return True  # the server already says this: adopt it
        stored = self._stored
        generations = {_generation(item) for item in stored.values()}
        generation = max([self._generation, *generations]) + 1
        names = set()
        taints = _taints_by_device(stored.values())
        for body in build_slices(self.node_name, devices, generation, self.driver):
            _keep_taint_times(body, taints)
            name = body["metadata"]["name"]
            names.add(name)
            current = stored.get(name)
            if current is None:
                stored[name] = await self._api.create_slice(body)
            else:
                body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                stored[name] = await self._api.replace_slice(name, body)
        for name in sorted(set(stored) - names):
            await self._api.delete_slice(name)
            del stored[name]
        self._generation, self._written = generation, wanted
        log_event(
            logger,
            "dra.slices.published",
            node=self.node_name,
            slices=len(names),
            devices=len(devices),
            generation=generation,
        )
        return True


def _versions(items: Iterable[JsonObject]) -> dict[str, str]:
    """Each slice's name -> resourceVersion: what tells one version of the pool from another."""
    return {str((item.get("metadata") or {}).get("name")): _version(item) for item in items}


def _version(item: JsonObject) -> str:
    return str((item.get("metadata") or {}).get("resourceVersion"))


def _own_change(stored: Mapping[str, JsonObject], kind: str, item: JsonObject) -> bool:
    """Whether a watched change is this publisher's own: a deleted slice it no longer holds, or
    a slice at the very version it wrote. (A change it made and then overwrote counts as
    foreign: the repair lists, finds the pool as written and writes nothing.)"""
    meta = item.get("metadata") or {}
    held = stored.get(str(meta.get("name")))
    if kind == "DELETED":
        return held is None
    return held is not None and _version(held) == _version(item)


def _generation(item: JsonObject) -> int:
    pool = item.get("spec", {}).get("pool", {})
    generation = pool.get("generation", 0)
    return generation if isinstance(generation, int) else 0


def _contents(items: Iterable[JsonObject]) -> list[tuple[str, Any]]:
    """What two sets of slices must share to say the same: name and spec but the generation
    and the times the API server stamps on taints."""
    result = []
    for item in items:
        spec = dict(item.get("spec", {}))
        spec["pool"] = {k: v for k, v in spec.get("pool", {}).items() if k != "generation"}
        spec["devices"] = [_without_taint_times(d) for d in spec.get("devices") or []]
        result.append((item["metadata"]["name"], spec))
    return sorted(result, key=lambda pair: pair[0])


def _without_taint_times(device: JsonObject) -> JsonObject:
    if not device.get("taints"):
        return device
    taints = [{k: v for k, v in t.items() if k != "timeAdded"} for t in device["taints"]]
    return {**device, "taints": taints}


def _taints_by_device(slices: Iterable[JsonObject]) -> dict[str, list[JsonObject]]:
    """The taints each device has on the server now, by device name."""
    return {
        device["name"]: device["taints"]
        for item in slices
        for device in item.get("spec", {}).get("devices") or []
        if device.get("taints")
    }


def _keep_taint_times(body: JsonObject, stored: Mapping[str, list[JsonObject]]) -> None:
    """Give each taint in `body` the `timeAdded` of the same taint (key and effect) already on
    the server, as the API server would stamp a new one with the time of this write."""
    for device in body["spec"]["devices"]:
        for taint in device.get("taints") or []:
            for old in stored.get(device["name"], ()):
                same = old.get("key") == taint["key"] and old.get("effect") == taint["effect"]
                if same and old.get("timeAdded"):
                    taint["timeAdded"] = old["timeAdded"]
