"""Which of several named configs applies to a node, as the reference plugin chooses it.

A ConfigMap holds named configs, one per key. The node's `nvidia.com/device-plugin.config`
label names the one that applies; a node without the label gets the default config, which is
the one named `default` unless another is given (`named`); with no default and exactly one
config, that one (`single`). A label naming no
config is an error the caller reports while it keeps the config in force.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Literal

from deviceplugin.model.errors import ConfigError
from deviceplugin.model.record import record

CONFIG_LABEL = "nvidia.com/device-plugin.config"
DEFAULT_NAME = "default"  # the default config when none is named

Reason = Literal["label", "default", "single"]


@record(frozen=True)
class Selection:
    """The config chosen and why."""

    name: str
    reason: Reason


def config_names(entries: Collection[str]) -> list[str]:
    """The config names among a mounted ConfigMap's directory entries: not `..data` and the
    other entries the kubelet keeps there, nor hidden files."""
    return sorted(entry for entry in entries if not entry.startswith("."))


def select_config(available: Collection[str], label: str | None, default: str | None) -> Selection:
    """The config for a node labelled `label` (None: no label). Raises ConfigError naming the
    label (or the default) and the configs there are."""
    known = ", ".join(sorted(available)) or "none"
    if label:
        if label in available:
            return Selection(label, "label")
        raise ConfigError(
            CONFIG_LABEL,
            f"the node names config {label!r}, which does not exist (configs: {known})",
        )
    default = default or (DEFAULT_NAME if DEFAULT_NAME in available else None)
    if default:
        if default in available:
            return Selection(default, "default")
        raise ConfigError("default config", f"{default!r} does not exist (configs: {known})")
    if len(available) == 1:
        return Selection(next(iter(available)), "single")
    raise ConfigError(
        CONFIG_LABEL,
        f"the node has no label, there is no default config and {len(available)} configs"
        f" to choose from ({known}): label the node or set a default",
    )
