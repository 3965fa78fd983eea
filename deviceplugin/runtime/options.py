"""What the node engine takes from a daemon's command line and environment (no imports beyond
the standard library: the command line builds it before anything heavy is loaded)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class EngineOptions:
    """The config file, the simulated node, the health settings and the config overrides."""

    config_file: str | None = None
    simulate: str | None = None
    simulate_events: str | None = None
    health_recovery_after: str = "5m"
    overrides: Mapping[str, str | None] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
