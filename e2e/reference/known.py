"""The documented differences between ours and the reference plugin (docs/compatibility.md).

Each entry names the fields it covers (a pattern over the difference's path, and optionally
the case) and why the two answer differently. A difference no entry covers is unexplained.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Difference:
    case: str
    field: str
    ours: Any
    reference: Any

    def __str__(self) -> str:
        return f"{self.field}: ours {self.ours!r}, reference {self.reference!r}"


Check = Callable[[Any, Any], bool]  # (ours, reference) -> whether this entry explains them


def _anything(ours: Any, reference: Any) -> bool:
    return True


@dataclass(frozen=True)
class Known:
    title: str  # the heading of its section in docs/compatibility.md
    field: str  # regular expression, matched against the whole path
    case: str = ""  # regular expression searched in the case's name; empty: any case
    check: Check = _anything  # what must hold of the two values

    def covers(self, difference: Difference) -> bool:
        return bool(
            re.fullmatch(self.field, difference.field)
            and (not self.case or re.search(self.case, difference.case))
            and self.check(difference.ours, difference.reference)
        )


def _same_items_in_another_order(ours: Any, reference: Any) -> bool:
    """Two comma lists of the same items (NVIDIA_VISIBLE_DEVICES, a CDI annotation)."""
    return (
        isinstance(ours, str)
        and isinstance(reference, str)
        and sorted(ours.split(",")) == sorted(reference.split(","))
    )


def _same_nodes_repeated(ours: Any, reference: Any) -> bool:
    """The same device nodes, the reference listing some more than once."""
    if not isinstance(ours, list) or not isinstance(reference, list):
        return False
    unique = {tuple(spec) for spec in reference}
    return sorted(ours) == sorted(list(spec) for spec in unique) and len(reference) > len(ours)


def _both_refuse(ours: Any, reference: Any) -> bool:
    return (ours, reference) == ("error INVALID_ARGUMENT", "error UNKNOWN")


HEALTH_QUERY = "get_default_active_thread_percentage"


def _asked_only_later(ours: Any, reference: Any) -> bool:
    """The reference's plugin asked its daemon once before registering; ours had not yet."""
    return bool(ours == [] and reference == [HEALTH_QUERY])


KNOWN: tuple[Known, ...] = (
    Known(
        "Time-slicing: `rename` and `devices` are honoured",
        r".*",
        case=r"config/dedicated-and-shared\.yaml",
    ),
    Known(
        "MPS: `rename` and `devices` are honoured, as with time-slicing",
        r".*",
        case=r"MPS x4, GPUs 0 and 1 ",
    ),
    Known("Refusals: INVALID_ARGUMENT, not UNKNOWN", r".*\.allocate\.\w+", check=_both_refuse),
    Known(
        "Device order: the request's, not a Go map's",
        r".*\.allocate\.\w+\.(envs\.NVIDIA_VISIBLE_DEVICES|annotations\..*)",
        case=r"index IDs",
        check=_same_items_in_another_order,
    ),
    Known(
        "Device nodes: each listed once",
        r".*\.allocate\.\w+\.devices",
        check=_same_nodes_repeated,
    ),
    Known(
        "MPS: the daemon is checked after start, not before",
        r"mps\.daemons\..+\.asked",
        check=_asked_only_later,
    ),
    # Only the choice among valid answers: `preferred.<request>.valid` is compared on its own.
    Known("Preferred allocation: policy and ties", r".*\.preferred\..*\.ids"),
)


def explain(difference: Difference) -> Known | None:
    """The documented entry covering this difference, if any."""
    return next((known for known in KNOWN if known.covers(difference)), None)
