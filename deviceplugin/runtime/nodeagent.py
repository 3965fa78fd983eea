"""`serve`'s link to its own Node: the config its label names, and its GPU labels.

With `--config-dir`, the directory holds named configs (a ConfigMap mounted whole) and the
Node's `nvidia.com/device-plugin.config` label chooses one (`model.configselect`). Before the
plugin starts, the Node is waited for up to FIRST_SIGHT_SECONDS; an API server that does not
answer by then leaves the default (or single) config in force until it does. A label change
switches the config in process, within the watch's latency. A label naming no config keeps
the config in force and says so in `/status` (`config.selection.error`), in
`deviceplugin_node_config_label_valid` 0, in a `config.selection.rejected` log line and in a
Warning Event on the Node, posted once per wrong value.

With `--gpu-labels on`, the labels of `model.gpulabels` are compared every LABEL_CHECK_SECONDS
and at every Node update with what the Node carries, and written when they differ (a MIG
re-cut, a config change, someone editing them).

Nothing here stops the plugin: API failures are logged and retried (`nodewatch`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from deviceplugin.model.config import Config
from deviceplugin.model.configselect import CONFIG_LABEL, Selection, config_names, select_config
from deviceplugin.model.devices import Inventory
from deviceplugin.model.errors import ConfigError
from deviceplugin.model.gpulabels import gpu_labels
from deviceplugin.model.jsonobject import JsonObject
from deviceplugin.model.log import log_event
from deviceplugin.node.configread import check_inside
from deviceplugin.ops.metrics import SharedMetrics
from deviceplugin.runtime.background import spawn
from deviceplugin.runtime.kubeclient import EVENTS, KubeClient, KubeError, connect
from deviceplugin.runtime.nodelabels import LabelWriter
from deviceplugin.runtime.nodewatch import NodeWatch
from deviceplugin.runtime.options import NodeOptions

if TYPE_CHECKING:
    from deviceplugin.runtime.engine import NodeEngine

logger = logging.getLogger(__name__)

FIRST_SIGHT_SECONDS = 10.0
LABEL_CHECK_SECONDS = 5.0
EVENT_NAMESPACE = "default"  # where Events about cluster-scoped objects (Nodes) go
EVENT_REASON = "DevicePluginConfigUnknown"


class Follower(Protocol):
    """What the agent drives: the device plugin's supervisor or the DRA driver. It changes
    the daemon's state only through the engine: a new config file is read by a reload on the
    engine's serialized path."""

    @property
    def engine(self) -> NodeEngine: ...

    @property
    def metrics(self) -> SharedMetrics: ...

    @property
    def inventory(self) -> Inventory | None: ...

    @property
    def config(self) -> Config: ...

    async def reload(
        self, trigger: str, force: bool = False, config_path: str | None = None
    ) -> bool: ...


class NodeAgent:
    """Follows this node's Node for `supervisor` (or the DRA driver); `start` before it
    starts, `serving` after, `stop` at the end."""

    def __init__(
        self, settings: NodeOptions, supervisor: Follower, client: KubeClient | None = None
    ) -> None:
        self.node_name = settings.node_name or socket.gethostname()
        self._supervisor = supervisor
        self._client = client or connect(settings.kubeconfig, settings.env)
        self._dir = Path(settings.config_dir) if settings.config_dir else None
        self._default = settings.default_config
        namespace = settings.env.get("POD_NAMESPACE") or "kube-system"
        self._writer = LabelWriter(self._client, self.node_name, namespace)
        self._writes_labels = settings.gpu_labels
        self._watch = NodeWatch(self._client, self.node_name, self._on_node)
        self._node: JsonObject = {}
        self._label: str | None = None  # the config label as last acted on
        self._selection: Selection | None = None
        self._error: str | None = None
        self._reported: str | None = None  # the wrong label value an Event was posted for
        self._label_error: str | None = None
        self._serving = False
        self._tasks: list[asyncio.Task[None]] = []
        self._lock = asyncio.Lock()
        self._label_lock = asyncio.Lock()
        supervisor.engine.selection_view = self.view

    # --- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Follow the Node; with --config-dir, choose the config the supervisor starts with: a
        label naming no config is reported and the default starts instead. Raises ConfigError
        when no config can be chosen at all (exit 2)."""
        self._tasks.append(asyncio.get_running_loop().create_task(self._watch.run()))
        if self._dir is None:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._watch.seen.wait(), FIRST_SIGHT_SECONDS)
        if not self._watch.seen.is_set():
            log_event(
                logger,
                "config.selection.unlabelled",
                logging.WARNING,
                node=self.node_name,
                error=self._watch.error or "no answer",
                using="the default config until the Node is read",
            )
        self._label = self._config_label()
        try:
            self._adopt(await self._choose(self._label))
        except ConfigError as exc:
            if self._label is None:
                raise
            # a wrong label at start: the default serves, and the label is reported as wrong
            self._adopt(await self._choose(None))
            await self._refuse(exc, self._label)
        # before the daemon starts, nothing else reads it: the file it starts with, confined
        self._supervisor.engine.config_file.within = str(self._dir)
        self._supervisor.engine.config_file.path = str(self.config_path())

    def serving(self) -> None:
        """The supervisor runs: act on label changes from now on, and keep GPU labels."""
        self._serving = True
        if self._dir is not None and self._config_label() != self._label:
            spawn(self._reselect("node label changed"), "node label")
        if self._writes_labels:
            self._tasks.append(asyncio.get_running_loop().create_task(self._keep_labels()))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._client.close()

    def config_path(self) -> Path:
        """The file of the config chosen for this node (for the config watch)."""
        assert self._dir is not None and self._selection is not None
        return self._dir / self._selection.name

    async def config_changed(self) -> None:
        """The ConfigMap changed: a config the label names may exist now; then reload."""
        await self._reselect("config file changed", reload_anyway=True)

    def view(self) -> dict[str, Any]:
        """What /status shows under `config.selection`."""
        return {
            "directory": str(self._dir) if self._dir else None,
            "node": self.node_name,
            "label": self._label,
            "name": self._selection.name if self._selection else None,
            "reason": self._selection.reason if self._selection else None,
            "error": self._error,
            "api_error": self._watch.error,
            "gpu_labels": self._writer.target or None if self._writes_labels else "off",
            "gpu_labels_error": self._label_error,
        }

    # --- the config label ---------------------------------------------------------------------

    def _config_label(self) -> str | None:
        labels = (self._node.get("metadata") or {}).get("labels") or {}
        value = labels.get(CONFIG_LABEL)
        return value if isinstance(value, str) and value else None

    async def _on_node(self, node: JsonObject) -> None:
        self._node = node
        if self._serving and self._dir is not None and self._config_label() != self._label:
            await self._reselect("node label changed")
        if self._serving and self._writes_labels:
            await self._sync_labels()

    async def _choose(self, label: str | None) -> Selection:
        directory = self._dir
        assert directory is not None
        try:
            entries = await asyncio.to_thread(lambda: [p.name for p in directory.iterdir()])
        except OSError as exc:
            raise ConfigError("--config-dir", f"cannot list {directory}: {exc.strerror}") from None
        selection = select_config(config_names(entries), label, self._default)
        # refused like a name that does not exist: the config in force (or the default) stays
        await asyncio.to_thread(check_inside, str(directory / selection.name), str(directory))
        return selection

    def _adopt(self, selection: Selection) -> None:
        self._selection = selection
        if self._error is not None:
            log_event(logger, "config.selection.restored", config=selection.name)
        self._error = self._reported = None
        self._supervisor.metrics.config_label_valid(True)
        log_event(
            logger,
            "config.selected",
            node=self.node_name,
            config=selection.name,
            reason=selection.reason,
        )

    async def _reselect(self, trigger: str, reload_anyway: bool = False) -> None:
        async with self._lock:
            label = self._config_label()
            self._label = label
            try:
                selection = await self._choose(label)
            except ConfigError as exc:
                await self._refuse(exc, label)
                if reload_anyway:
                    await self._supervisor.reload(trigger)
                return
            if selection != self._selection or self._error is not None:
                self._adopt(selection)
            await self._supervisor.reload(trigger, config_path=str(self.config_path()))

    async def _refuse(self, exc: ConfigError, label: str | None) -> None:
        """Keep the config in force; say why in the log, /status, the metric and an Event."""
        self._error = str(exc)
        self._supervisor.metrics.config_label_valid(False)
        log_event(
            logger,
            "config.selection.rejected",
            logging.ERROR,
            node=self.node_name,
            label=label or "",
            error=str(exc),
            keeping=self._selection.name if self._selection else "",
        )
        if label is not None and label != self._reported:
            self._reported = label
            spawn(self._post_event(str(exc)), "node event")

    async def _post_event(self, message: str) -> None:
        meta = self._node.get("metadata") or {}
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        keeping = f"; keeping config {self._selection.name!r}" if self._selection else ""
        event: JsonObject = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{self.node_name}.", "namespace": EVENT_NAMESPACE},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Node",
                "name": self.node_name,
                "uid": meta.get("uid", self.node_name),
            },
            "reason": EVENT_REASON,
            "message": (message + keeping)[:1024],
            "type": "Warning",
            "source": {"component": "deviceplugin", "host": self.node_name},
            "reportingComponent": "deviceplugin",
            "reportingInstance": self.node_name,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self._client.create(EVENTS, event)
        except KubeError as exc:
            log_event(logger, "node.event.failed", logging.WARNING, error=str(exc))

    # --- GPU labels ---------------------------------------------------------------------------

    async def _keep_labels(self) -> None:
        while True:
            if self._watch.seen.is_set():
                await self._sync_labels()
            await asyncio.sleep(LABEL_CHECK_SECONDS)

    async def _sync_labels(self) -> None:
        inventory = self._supervisor.inventory
        if inventory is None:
            return
        wanted = gpu_labels(inventory, self._supervisor.config)
        if not wanted:
            return
        try:
            async with self._label_lock:
                written = await self._writer.write(wanted, self._node)
        except KubeError as exc:
            if exc.refused:
                resource = "nodefeatures" if self._writer.target == "NodeFeature" else "nodes"
                self._supervisor.metrics.api_write_refused(resource)
            if self._label_error != str(exc):
                event = "api.write.refused" if exc.refused else "gpu_labels.failed"
                level = logging.ERROR if exc.refused else logging.WARNING
                log_event(logger, event, level, error=str(exc))
            self._label_error = str(exc)
            return
        self._label_error = None
        if written:
            log_event(logger, "gpu_labels.written", target=self._writer.target, labels=wanted)
