"""Structured logging: every line is a stable event name plus key=value fields.

`log_event(logger, "plugin.registered", resource=..., devices=8)` writes
`... INFO plugin.registered resource=nvidia.com/gpu devices=8` as text, or one JSON object per
line with `--log-format json`, so log pipelines can filter on `event` instead of parsing prose.
This module is the vocabulary every layer speaks; `deviceplugin.ops.logs` formats the lines.
"""

from __future__ import annotations

import logging
from typing import Any

FIELDS = "dp_fields"  # the LogRecord attribute that carries an event's fields


def log_event(logger: logging.Logger, event: str, level: int = logging.INFO, **fields: Any) -> None:
    """Log one event with its fields."""
    if logger.isEnabledFor(level):
        logger.log(level, event, extra={FIELDS: fields})


def log_exception(
    logger: logging.Logger, event: str, error: BaseException | None = None, **fields: Any
) -> None:
    """Log one event at ERROR with its fields and a traceback: of `error`, or else of the
    exception being handled."""
    logger.error(event, exc_info=error or True, extra={FIELDS: fields})
