"""Which NVML events take a device away: the Xid policy and its environment knobs.

Two base policies. `reference` keeps the upstream plugin's behaviour (application Xids 13, 31,
43, 45, 68 and 109 ignored, every other Xid critical) so a migration changes nothing by default.
`catalog` follows NVIDIA's Xid catalog instead: an Xid after which the GPU can serve new work
once the application restarts (RESTART_APP, IGNORE, Xid 45's workflow) leaves the device in; one
that needs a GPU reset, a reboot, support or a decode NVML events cannot carry takes it out, and
the reason names the action ("xid-95: RESET_GPU"). Unknown Xids (NVML reports 999) are critical
under both.

`DP_DISABLE_HEALTHCHECKS` adds ignored Xids or switches Xid checks off (`all` / `xids`);
`DP_ENABLE_HEALTHCHECKS` names Xids that stay critical whatever else says (`all`: every Xid).
An explicit enable list wins even over DISABLE=all, so `DISABLE=all ENABLE=48` means "only 48
is critical" (the upstream plugin switches monitoring off in that case instead).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import field
from typing import Literal

from deviceplugin.model.errors import ConfigError
from deviceplugin.model.log import log_event
from deviceplugin.model.record import record
from deviceplugin.model.yamlimport import yaml

logger = logging.getLogger(__name__)

PolicyName = Literal["reference", "catalog"]

REFERENCE_IGNORED: frozenset[int] = frozenset({13, 31, 43, 45, 68, 109})

# Catalog workflows whose outcome, when an NVML event is all we have, is a GPU reset.
_WORKFLOW_ACTION = {"WORKFLOW_XID_48": "RESET_GPU", "WORKFLOW_NVLINK_ERR": "RESET_GPU"}


@record(frozen=True)
class XidInfo:
    """What NVIDIA's catalog says about one Xid."""

    xid: int
    mnemonic: str
    action: str  # the catalog's immediate action bucket
    back: str  # app_restart | gpu_reset | node_reboot | depends


def parse_xid_table(text: str) -> Mapping[int, XidInfo]:
    """The Xid table (`data/xids.yaml`, read by `node.xidcatalog`) from its text."""
    table: dict[int, XidInfo] = {}
    for xid, row in yaml.safe_load(text).items():
        mnemonic, action, back = row
        table[int(xid)] = XidInfo(int(xid), str(mnemonic), str(action), str(back))
    return table


@record(frozen=True)
class Decision:
    """What to do with one Xid: `fatal` marks the device; `reason` is what the kubelet side sees."""

    fatal: bool
    action: str  # a catalog bucket, or critical / ignored / disabled / enabled
    reason: str = ""


@record(frozen=True)
class HealthPolicy:
    """Xid policy: a base (`reference` or `catalog`) adjusted by the two environment lists."""

    base: PolicyName = "reference"
    ignored: frozenset[int] = frozenset()  # DP_DISABLE_HEALTHCHECKS numbers
    ignore_all: bool = False  # DP_DISABLE_HEALTHCHECKS=all|xids
    enabled: frozenset[int] = frozenset()  # DP_ENABLE_HEALTHCHECKS numbers
    enable_all: bool = False  # DP_ENABLE_HEALTHCHECKS=all
    # the Xid table the catalog policy follows (empty under `reference`, which needs none)
    catalog: Mapping[int, XidInfo] = field(default_factory=dict, compare=False, hash=False)

    @classmethod
    def from_env(
        cls, env: Mapping[str, str], catalog: Callable[[], Mapping[int, XidInfo]]
    ) -> HealthPolicy:
        """Read DP_DISABLE_HEALTHCHECKS, DP_ENABLE_HEALTHCHECKS and DP_HEALTH_POLICY; `catalog`
        gives the Xid table, asked for only under the catalog policy.

        Junk list entries are logged and skipped (as upstream does); an unknown policy name is a
        ConfigError, because silently falling back would flip which Xids take GPUs away.
        """
        base = env.get("DP_HEALTH_POLICY", "").strip().lower() or "reference"
        if base not in ("reference", "catalog"):
            raise ConfigError("DP_HEALTH_POLICY", f"must be reference or catalog, got {base!r}")
        ignored, ignore_all = _xid_list(env, "DP_DISABLE_HEALTHCHECKS", ("all", "xids"))
        enabled, enable_all = _xid_list(env, "DP_ENABLE_HEALTHCHECKS", ("all",))
        return cls(
            base="catalog" if base == "catalog" else "reference",
            ignored=ignored,
            ignore_all=ignore_all,
            enabled=enabled,
            enable_all=enable_all,
            catalog=catalog() if base == "catalog" else {},
        )

    @property
    def watches_xids(self) -> bool:
        """False when no Xid can ever be critical, so there is nothing to monitor."""
        return not self.ignore_all or self.enable_all or bool(self.enabled)

    def decide(self, xid: int) -> Decision:
        """Whether this Xid takes the device away, and why."""
        if self.enable_all or xid in self.enabled:
            return Decision(True, "enabled", f"xid-{xid}")
        if self.ignore_all or xid in self.ignored:
            return Decision(False, "disabled")
        if self.base == "reference":
            if xid in REFERENCE_IGNORED:
                return Decision(False, "ignored")
            return Decision(True, "critical", f"xid-{xid}")
        info = self.catalog.get(xid)
        if info is None:
            return Decision(True, "critical", f"xid-{xid}")
        if info.back == "app_restart":
            return Decision(False, info.action)
        action = _WORKFLOW_ACTION.get(info.action, info.action)
        return Decision(True, action, f"xid-{xid}: {action}")


def _xid_list(
    env: Mapping[str, str], name: str, everything: tuple[str, ...]
) -> tuple[frozenset[int], bool]:
    """Parse a comma list of Xids; returns (the numbers, whether a word meaning 'all' appeared)."""
    numbers: set[int] = set()
    every = False
    for item in env.get(name, "").lower().split(","):
        item = item.strip()
        if not item:
            continue
        if item in everything:
            every = True
        elif item.isascii() and item.isdigit():
            numbers.add(int(item))
        else:
            log_event(
                logger,
                "health.config.skipped",
                logging.WARNING,
                variable=name,
                value=item,
                hint="not an Xid number",
            )
    return frozenset(numbers), every
