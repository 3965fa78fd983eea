"""An API server's answer as a JSON object, whatever came: the Kubernetes clients of the
device plugin and of the DRA driver read answers the same way."""

from __future__ import annotations

import json
from typing import Any

JsonObject = dict[str, Any]


def json_object(data: bytes) -> JsonObject:
    """`data` parsed when it is a JSON object; {} for anything else (empty, not JSON, a list)."""
    try:
        answer = json.loads(data) if data else {}
    except ValueError:
        return {}
    return answer if isinstance(answer, dict) else {}
