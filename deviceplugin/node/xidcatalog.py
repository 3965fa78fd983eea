"""NVIDIA's Xid catalog as packaged (`model/data/xids.yaml`), read once; and the health policy
of an environment with it (`model.xidpolicy` decides, this reads)."""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache

from deviceplugin.model.xidpolicy import HealthPolicy, XidInfo, parse_xid_table


@cache
def xid_table() -> Mapping[int, XidInfo]:
    """The packaged Xid table, parsed once."""
    from importlib import resources  # 0.7 MiB of imports, for the catalog policy only

    return parse_xid_table(
        resources.files("deviceplugin.model").joinpath("data/xids.yaml").read_text()
    )


def policy_from_env(env: Mapping[str, str]) -> HealthPolicy:
    """The Xid policy DP_HEALTH_POLICY, DP_DISABLE_HEALTHCHECKS and DP_ENABLE_HEALTHCHECKS ask
    for. Raises ConfigError for an unknown policy name."""
    return HealthPolicy.from_env(env, xid_table)
