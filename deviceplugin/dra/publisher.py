"""Publishes this node's devices as `resource.k8s.io/v1` ResourceSlices, and keeps them so.

How to use it (the composition root does this):

    api = KubeApi(kubeclient.connect(settings.kubeconfig, env))  # or connect(..., server=url)
    publisher = SlicePublisher(api, node_name="node-1", driver="gpu.nvidia.com")
    publisher.want(inventory, unhealthy)   # at start, and after every change: returns at once
    publisher.request_refresh()            # after the kubelet (re-)registers the plugin
    publisher.check(listed_items)          # a fresh list: repaired if not as written
    publisher.changed_on_server(kind, item)  # a watched change: repaired if not ours
    ...
    await publisher.close()                # stops syncing, closes the client

`await publish(...)` and `await refresh()` do the same and wait for the outcome (tests, the
benchmark). `inventory` is the node as discovery found it and `unhealthy` the health engine's
UUID -> reason (`model.slices` publishes the hardware as it is, whatever the device plugin's
MIG strategy), and `taint` (constructor) the effect of the taint an unhealthy device gets, or
None for no taint, `memory_shares` whether whole GPUs are published shareable by memory
(`model.memoryshares`), and `dynamic_mig` whether MIG-capable GPUs are published as partitions
with their counter sets, in slices of their own (`model.migpartitions`). `features` says which
gated fields the API server keeps (`dra/serverfeatures.py`; all, unless the driver learned
otherwise): one it drops is never relied on. Without counters a partitionable GPU is published
whole only, without consumable capacity whole GPUs are published without shares, and without
taints a device that would carry one (unhealthy, or overlapped by a foreign MIG instance) is
left out of the slices until it needs none. Call `want` again
whenever the inventory or a device's health changes; calling it with an unchanged state writes
nothing. Every API call is made by the publisher's
own sync task (the shape of the slices controller behind Kubernetes' `kubeletplugin.Helper`),
so the engine's serialized path never waits on the API server.

What it guarantees:

- one pool per node (named after the node), cut into slices at the API's device limit, named
  `<node>-<driver>-<n>`; on any change the pool's generation is bumped and every slice of the
  pool rewritten (consumers use only the newest generation, so no slice may lag behind), slices
  no longer needed are deleted, and so are stale slices of this node, driver and pool found at
  start; a slice on this node of another pool is left alone (the node-restriction policy
  refuses the driver's token any write outside its node's pool);
- after a restart, slices that already say what this node has are adopted, not rewritten;
- a slice someone else deleted, changed or added is put back as written (`dra/slicewatch.py`
  hands over what the server says): the publisher tells its own writes from the watch by
  resourceVersion, so its own writes cost no second look. The first repair after a quiet
  minute is made at once; while repairs keep coming (another writer with other content, such
  as the other instance during a rolling update) each waits as a retry does, so two writers
  never fight at full speed;
- a taint keeps the `timeAdded` the API server gave it while the device stays tainted, so
  rewriting a slice never restarts a `NoExecute` toleration's countdown;
- an API error never escapes: it is logged (`dra.publish.failed`), the slices are listed
  afresh and the write retried with exponential backoff until it succeeds or a newer state
  supersedes it. `publish` returns whether the attempt that carried its state wrote it;
  `wait_published()` waits until the newest state is on the server;
- every attempt that reaches the API server, retries included, is reported to the optional
  `observer` with its duration and outcome, and `written` says what the pool holds. A failed
  repair is retried as a failed publish is;
- a write the API server refuses (403: RBAC, or the chart's own-node admission policy) is
  counted at every attempt, logged once per message (`api.write.refused`, with the server's
  message) and kept in `refusal` for /status until a write succeeds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from deviceplugin.model.devices import Inventory
from deviceplugin.model.gatedfields import ALL_KEPT, ServerFeatures, slice_contents
from deviceplugin.model.log import log_event
from deviceplugin.model.record import record
from deviceplugin.model.slices import (
    DEFAULT_TAINT,
    DRIVER,
    TaintEffect,
    build_slices,
)
from deviceplugin.runtime.kubeclient import KubeError

if TYPE_CHECKING:
    from deviceplugin.model.owners import Holdings

logger = logging.getLogger(__name__)

REPAIR_QUIET_SECONDS = 60.0  # repairs this far apart are each made at once

JsonObject = dict[str, Any]


class SliceApi(Protocol):
    """The API calls the publisher makes (`kubeapi.KubeApi`; raises `KubeError`)."""

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
    def api_write_refused(self, resource: str) -> None: ...


@record(frozen=True)
class Backoff:
    """Delays between retries after an API error: first, doubling, up to most."""

    first: float = 0.2
    most: float = 30.0

    def delay(self, failures: int) -> float:
        """The wait after `failures` failed attempts in a row (>= 1)."""
        return float(min(self.first * 2 ** max(failures - 1, 0), self.most))


class SlicePublisher:
    """Owns `api`: `close()` closes it. One task of its own makes every API call, so a caller
    (the engine's serialized path) only records what it wants and never waits on the server."""

    def __init__(
        self,
        api: SliceApi,
        node_name: str,
        driver: str = DRIVER,
        backoff: Backoff | None = None,
        taint: TaintEffect | None = DEFAULT_TAINT,
        observer: PublishObserver | None = None,
        memory_shares: bool = False,
        dynamic_mig: bool = False,
        features: ServerFeatures = ALL_KEPT,
    ) -> None:
        self.node_name = node_name
        self.features = features  # what the API server keeps: set before the next `want`
        self.memory_shares = memory_shares
        self.dynamic_mig = dynamic_mig
        self.driver = driver
        self.taint = taint
        self._api = api
        self._backoff = backoff or Backoff()
        self._observer = observer
        self.refusal: str | None = None  # why the API server refused the latest write
        self._desired: list[JsonObject] = []  # the devices to publish
        self._counter_sets: list[JsonObject] = []  # and the counter sets (dynamic MIG)
        self._version = 0  # bumped by every want(); the sync task chases the newest
        self._synced_version = -1
        self._stored: dict[str, JsonObject] | None = None  # slices on the server; None: re-list
        self._generation = 0
        self._written: list[tuple[str, Any]] | None = None  # contents of the last write
        self._failures = 0  # failed attempts in a row
        self._repairs = 0  # repairs since the last quiet minute
        self._last_repair = -REPAIR_QUIET_SECONDS
        self._not_before = 0.0  # a paced repair waits until then
        self._wake = asyncio.Event()
        self._answering = asyncio.Event()  # set by a fresh list: the API server answers
        self._syncing = False
        self._seen_while_syncing: list[tuple[str, JsonObject]] = []
        self._waiters: list[tuple[int, asyncio.Future[bool]]] = []
        self._task: asyncio.Task[None] | None = None
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

    def want(
        self,
        inventory: Inventory,
        unhealthy: Mapping[str, str],
        blocked: Mapping[str, str] | None = None,
        withheld: Holdings | None = None,
    ) -> None:
        """Make the slices say what `inventory` and `unhealthy` say, in the background: returns
        at once, whatever the API server does. `blocked` (device name -> why): dynamic MIG
        devices a MIG instance this driver did not create overlaps, published tainted;
        `withheld`: what device-plugin pods hold, left out."""
        self._desired, self._counter_sets = slice_contents(
            inventory,
            unhealthy,
            self.driver,
            self.taint,
            self.memory_shares,
            self.dynamic_mig,
            self.features,
            blocked,
            withheld,
        )
        self._version += 1
        self._published.clear()
        self._kick()

    async def publish(self, inventory: Inventory, unhealthy: Mapping[str, str]) -> bool:
        """`want`, then wait for the attempt that carries it: True once written, False when
        that attempt failed (it is retried in the background)."""
        self.want(inventory, unhealthy)
        return await self._outcome()

    def request_refresh(self) -> bool:
        """List the slices afresh and repair them, in the background: for when someone else may
        have changed or deleted them (the kubelet wipes a node's slices when it restarts or
        loses the plugin for 30 s, so call this after each registration). False before the
        first `want`, which has nothing to repair them with."""
        if self._version == 0:
            return False
        self._stored = None
        self._kick()
        return True

    async def refresh(self) -> bool:
        """`request_refresh`, then wait: True once the slices say the newest state."""
        if not self.request_refresh():
            return False
        return await self._outcome()

    def check(self, found: Sequence[JsonObject]) -> None:
        """Repair the slices unless `found` (a fresh list of them) holds exactly the versions
        last written: one was deleted, changed or added while nobody watched. A failed write
        waiting out its backoff is retried at once: the server answers again."""
        self._answering.set()  # the server answers again: a retry need not wait out its backoff
        if self._syncing or self._stored is None:
            return  # a sync that lists anyway is under way or due
        if _versions(self._own(found)) != _versions(self._stored.values()):
            self._repair("the listed slices are not the ones written")

    def _own(self, items: Iterable[JsonObject]) -> list[JsonObject]:
        """The slices of this node's pool (named after the node). A slice on this node of
        another pool is not this publisher's to rewrite or delete, nor counted in its generation:
        the node-restriction policy refuses its token any write to it."""
        return [item for item in items if _pool_name(item) == self.node_name]

    def changed_on_server(self, kind: str, item: JsonObject) -> None:
        """A watch saw `item` ADDED, MODIFIED or DELETED: repair unless it is this publisher's
        own write (judged once the sync in flight, which may have made it, has ended)."""
        if self._syncing:
            self._seen_while_syncing.append((kind, item))
            return
        if self._stored is None or not self._own([item]) or _own_change(self._stored, kind, item):
            return
        name = (item.get("metadata") or {}).get("name")
        self._repair(f"ResourceSlice {name} {kind.lower()} by another client")

    async def wait_published(self) -> None:
        """Return once the newest state given to `want` is on the server."""
        await self._published.wait()

    async def close(self) -> None:
        """Stop syncing (a call in flight is cancelled) and close the client."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for _, waiter in self._waiters:
            waiter.cancel()
        await self._api.close()

    # --- syncing --------------------------------------------------------------------------------

    def _kick(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
        self._wake.set()

    async def _outcome(self) -> bool:
        waiter: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiters.append((self._version, waiter))
        return await waiter

    def _settle(self, version: int, ok: bool) -> None:
        """Tell the waiters whose state the attempt at `version` carried how it went."""
        for wanted, waiter in list(self._waiters):
            if wanted <= version:
                self._waiters.remove((wanted, waiter))
                if not waiter.done():
                    waiter.set_result(ok)

    def _repair(self, reason: str) -> None:
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
        self._stored = None
        self._not_before = max(self._not_before, now + delay)
        self._kick()

    async def _run(self) -> None:
        """The sync task: each wake syncs the newest state; a failure is retried with backoff
        until it succeeds or a newer state supersedes it."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            wait = self._not_before - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if self._version == 0:
                continue
            if self._stored is not None and self._synced_version == self._version:
                self._settle(self._version, True)
                continue
            if not await self._attempt(retry=self._failures > 0):
                self._answering.clear()
                with contextlib.suppress(TimeoutError):  # the backoff, cut short by an answer
                    await asyncio.wait_for(
                        self._answering.wait(), self._backoff.delay(self._failures)
                    )
                self._wake.set()

    async def _attempt(self, retry: bool = False) -> bool:
        """One sync of the newest state; logs a failure."""
        version = self._version
        began = time.perf_counter()
        self._syncing = True
        try:
            reached_api = await self._sync(self._desired, self._counter_sets)
        except Exception as err:  # the driver must outlive any API failure
            self._report(began, ok=False)
            self._stored = None
            self._synced_version = -1  # what the server holds is unknown: retry even a repair
            self._failures += 1
            if isinstance(err, KubeError) and err.refused:
                self._refused(str(err))
            else:
                log_event(
                    logger,
                    "dra.publish.failed",
                    logging.WARNING,
                    node=self.node_name,
                    error=str(err) or repr(err),
                    retry=retry,
                )
            self._settle(version, False)
            return False
        finally:
            self._syncing = False
        if reached_api:
            self._report(began, ok=True)
        self.refusal = None
        self._synced_version = version
        self._failures = 0
        if version == self._version:
            self._published.set()
        self._settle(version, True)
        seen, self._seen_while_syncing = self._seen_while_syncing, []
        for kind, item in seen:
            self.changed_on_server(kind, item)
        return True

    def _refused(self, message: str) -> None:
        """The API server refused a write (RBAC, an admission policy): counted each time,
        logged once per message, shown in /status until a write succeeds. Retried with backoff
        all the same: an operator may fix the policy."""
        if self._observer is not None:
            self._observer.api_write_refused("resourceslices")
        if message != self.refusal:
            log_event(
                logger, "api.write.refused", logging.ERROR, node=self.node_name, error=message
            )
        self.refusal = message

    def _report(self, began: float, ok: bool) -> None:
        if self._observer is not None:
            self._observer.publish_done(time.perf_counter() - began, ok)

    async def _sync(self, devices: Sequence[JsonObject], sets: Sequence[JsonObject]) -> bool:
        """Bring the server's slices to `devices` and counter `sets`; False when that needed no
        API call."""
        wanted = _contents(build_slices(self.node_name, devices, 0, self.driver, sets))
        if self._stored is not None and wanted == self._written:
            return False  # nothing changed since the last write
        if self._stored is None:
            listed, _ = await self._api.list_slices(self.node_name, self.driver)
            found = self._own(listed)
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
        for body in build_slices(self.node_name, devices, generation, self.driver, sets):
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


def _pool_name(item: JsonObject) -> object:
    return (item.get("spec") or {}).get("pool", {}).get("name")


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
        if not spec.get("sharedCounters"):  # a device slice, maybe empty (then left out)
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
    for device in body["spec"].get("devices") or []:
        for taint in device.get("taints") or []:
            for old in stored.get(device["name"], ()):
                same = old.get("key") == taint["key"] and old.get("effect") == taint["effect"]
                if same and old.get("timeAdded"):
                    taint["timeAdded"] = old["timeAdded"]
