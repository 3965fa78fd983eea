"""The config file of a running plugin or DRA driver, followed through reloads.

The file is untrusted input that a reload reads while the plugin serves: reading it, and the
caller's parsing and planning from it (`step`), run off the event loop within
CONFIG_STEP_SECONDS each (`offloop.OffLoop`), so a FIFO, a huge file or a stuck file system
never stops Allocate, Prepare, `/healthz` or SIGTERM; a step that takes longer is a ConfigError
naming the file.

A reload is asked for at every event in the file's directory (one ConfigMap update makes
several: the `..data` symlink is swapped) and at SIGHUP, and most find the content as it was.
`changed` reads the file and hands back only content worth judging: content in force or already
refused is not judged again unless the reload is forced, so a bad file is logged once, not at
every event. The caller parses and applies what it gets and reports it with `adopt` or `reject`.
A refusal is logged (`config.rejected`, error level, naming the file and the field), counted
(`deviceplugin_config_reloads_total`) and shown by `deviceplugin_config_last_reload_successful`
0 and `last_error` until the file's content is in force again; the last good config stays in
force meanwhile.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from deviceplugin.model.config import ParsedConfig
from deviceplugin.model.errors import ConfigError
from deviceplugin.model.log import log_event
from deviceplugin.model.record import record
from deviceplugin.node.configread import read_text
from deviceplugin.ops.metrics import SharedMetrics
from deviceplugin.runtime.offloop import OffLoop

logger = logging.getLogger(__name__)

# The applied config is logged whole up to this size; a larger one (tens of thousands of rename
# rules fit in a ConfigMap's 1 MiB) is logged by size and digest, never as a megabyte line.
LOGGED_CONFIG_LIMIT = 16 * 1024

CONFIG_STEP_SECONDS = 10.0  # the most reading, parsing or planning from the config file may take
T = TypeVar("T")


@record(frozen=True)
class Content:
    """What the config file holds: its text, or None when there is no config file (defaults)."""

    text: str | None


class ConfigFile:
    """The file at `path` (None: no config file) and what became of its contents."""

    def __init__(self, path: str | None, metrics: SharedMetrics) -> None:
        self.path = path
        self.within: str | None = None  # with --config-dir: the file must resolve inside it
        self.last_error: str | None = None  # why the file's latest content was refused
        self.last_error_field: str | None = None  # the field it names, "" for none
        self._metrics = metrics
        self._off_loop = OffLoop(CONFIG_STEP_SECONDS)
        self._in_force: str | None = None
        self._refused: str | None = None

    async def step(self, job: Callable[[], T], verb: str) -> T:
        """`job()` off the loop; one that takes too long is a ConfigError naming the file."""
        source = self.path or "the config"
        try:
            return await self._off_loop.run(job, f"{verb} {source}")
        except TimeoutError as exc:
            raise ConfigError(self.path or "", str(exc)) from None

    async def read(self) -> str | None:
        """The file's content; None without a config file. Raises ConfigError naming the file."""
        path, within = self.path, self.within
        if not path:
            return None
        return await self.step(lambda: read_text(path, within=within), "reading")

    async def changed(self, trigger: str, force: bool = False) -> Content | None:
        """The content when a reload must judge it; None when there is nothing to judge (the
        content is in force or was refused already; an unreadable file is refused here)."""
        try:
            text = await self.read()
        except ConfigError as exc:
            unreadable = f"unreadable: {exc}"  # judged once, like any other refused content
            if force or unreadable != self._refused:
                self.reject(trigger, exc, unreadable)
            return None
        if force or text not in (self._in_force, self._refused):
            return Content(text)
        if text == self._in_force:  # back to the config in force: nothing is wrong any more
            self._clear_refusal()
        self._metrics.config_reloaded("unchanged")
        return None

    def adopt(self, parsed: ParsedConfig, text: str | None, reloaded: bool = True) -> None:
        """`text` (parsed: `parsed`) is now in force; `reloaded` False at start-up, where it
        is not counted as a reload."""
        self._in_force = text
        self._clear_refusal()
        for warning in parsed.warnings:
            log_event(logger, "config.warning", logging.WARNING, detail=warning)
        log_event(logger, "config.applied", source=self.path or "defaults", **logged(parsed))
        if reloaded:
            self._metrics.config_reloaded("applied")

    def reject(self, trigger: str, exc: Exception, text: str | None) -> None:
        """`text` is refused for `exc`: judged again only once it changes, or when forced."""
        self._refused = text
        self.last_error = str(exc)
        self.last_error_field = exc.path if isinstance(exc, ConfigError) else ""
        self._metrics.config_reloaded("rejected")
        self._metrics.config_in_force(False)
        log_event(
            logger,
            "config.rejected",
            logging.ERROR,
            trigger=trigger,
            file=self.path or "",
            field=self.last_error_field,
            error=str(exc),
            keeping="last good config",
        )

    def _clear_refusal(self) -> None:
        """The content in force is the file's latest: nothing is wrong with the config."""
        self._refused = self.last_error = self.last_error_field = None
        self._metrics.config_in_force(True)


def logged(parsed: ParsedConfig) -> dict[str, Any]:
    """The `config.applied` fields: the effective config, or its size and digest if large."""
    config = parsed.config.dump()
    text = json.dumps(config, sort_keys=True, separators=(",", ":"))
    if len(text) <= LOGGED_CONFIG_LIMIT:
        return {"config": config}
    import hashlib  # only for a large config: OpenSSL's hashes cost 0.7 MiB

    digest = hashlib.sha256(text.encode()).hexdigest()
    return {"config_bytes": len(text), "config_sha256": digest}
