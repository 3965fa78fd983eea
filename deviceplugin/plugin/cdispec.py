"""Keeps this node's CDI spec file in step with the inventory and the config in force.

The supervisor calls `sync` whenever it adopts an inventory or a config, before it registers
anything, so every CDI name Allocate can hand out is defined by the time the kubelet can ask.
Health changes do not come here: a device that turns Unhealthy stays in the inventory and in
the spec, so containers already running on it can still be restarted. With no CDI strategy left
(or no device to define) the file is removed. `cdi-spec` prints the same spec without writing it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deviceplugin.model.allocation import cdi_enabled, spec_file_name
from deviceplugin.model.config import Config
from deviceplugin.model.devices import Inventory
from deviceplugin.model.log import log_event
from deviceplugin.node.cdiwriter import SpecWriter, errno_name

if TYPE_CHECKING:
    from deviceplugin.model.cdi import CdiOptions

logger = logging.getLogger(__name__)


def node_spec(inventory: Inventory, config: Config, proc_root: str) -> dict[str, Any]:
    """The spec for this inventory and config, from a fresh scan of the host. Raises CdiError
    when the host lacks something a device needs."""
    # The spec's builder and the host scan only on a node with a CDI strategy.
    from deviceplugin.model.cdi import CdiOptions, build_spec
    from deviceplugin.node.hostscan import scan_host

    options = CdiOptions.from_config(config)
    scan = scan_host(inventory.driver_version, options.driver_root, options.dev_root, proc_root)
    return build_spec(inventory, scan, options)


class CdiSpecKeeper:
    """Owns `<directory>/k8s.device-plugin.nvidia.com-gpu.json`. `error` is why the last sync
    failed (None once it succeeds), for /readyz."""

    def __init__(self, directory: Path, proc_root: str) -> None:
        self.writer = SpecWriter(directory / spec_file_name())
        self.proc_root = proc_root
        self.error: str | None = None
        self._in_force: tuple[Inventory, CdiOptions] | None = None  # what the file holds

    def sync(self, inventory: Inventory | None, config: Config) -> bool:
        """Write, rewrite or remove the file as `inventory` and `config` require; True when the
        file is as required. A failure is logged with the path and errno and kept in `error`
        for the caller to retry."""
        wanted = inventory is not None and bool(inventory.gpus) and cdi_enabled(config)
        path = str(self.writer.path)
        if not wanted or inventory is None:
            try:
                if self.writer.remove():
                    log_event(logger, "cdi.spec.removed", path=path)
                self._in_force = None
            except OSError as exc:
                return self._failed(path, errno_name(exc), exc.strerror or str(exc))
            return self._succeeded(path)
        from deviceplugin.model.cdi import CdiError, CdiOptions  # only with a CDI strategy

        options = CdiOptions.from_config(config)
        if self.error is None and self._in_force == (inventory, options):
            return True
        try:
            spec = node_spec(inventory, config, self.proc_root)
            if self.writer.write(spec):
                log_event(
                    logger,
                    "cdi.spec.written",
                    path=path,
                    devices=len(spec["devices"]),
                    cdi_version=spec["cdiVersion"],
                )
            self._in_force = (inventory, options)
        except OSError as exc:
            return self._failed(path, errno_name(exc), exc.strerror or str(exc))
        except CdiError as exc:
            return self._failed(path, "", str(exc))
        return self._succeeded(path)

    def _succeeded(self, path: str) -> bool:
        if self.error is not None:
            log_event(logger, "cdi.spec.recovered", path=path)
        self.error = None
        return True

    def _failed(self, path: str, code: str, reason: str) -> bool:
        """Keep the error; log it at ERROR when it is new, so a retry loop does not flood.
        False: the file is not as required."""
        error = f"{path}: {code + ' ' if code else ''}{reason}"
        level = logging.ERROR if error != self.error else logging.DEBUG
        self.error, self._in_force = error, None
        log_event(
            logger,
            "cdi.spec.failed",
            level,
            path=path,
            errno=code,
            error=reason,
            retry="while serving",
        )
        return False
