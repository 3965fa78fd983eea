"""Structured logging: every line is a stable event name plus key=value fields.

`log_event(logger, "plugin.registered", resource=..., devices=8)` writes
`... INFO plugin.registered resource=nvidia.com/gpu devices=8` as text, or one JSON object per
line with `--log-format json`, so log pipelines can filter on `event` instead of parsing prose.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, Literal

LogFormat = Literal["text", "json"]
_FIELDS = "dp_fields"


def log_event(logger: logging.Logger, event: str, level: int = logging.INFO, **fields: Any) -> None:
    """Log one event with its fields."""
    if logger.isEnabledFor(level):
        logger.log(level, event, extra={_FIELDS: fields})


def log_exception(
    logger: logging.Logger, event: str, error: BaseException | None = None, **fields: Any
) -> None:
    """Log one event at ERROR with its fields and a traceback: of `error`, or else of the
    exception being handled."""
    logger.error(event, exc_info=error or True, extra={_FIELDS: fields})


def _format_value(value: Any) -> str:
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"))
    if isinstance(value, (list, tuple, set, frozenset)):
        value = ",".join(str(item) for item in value)
    text = str(value)
    if text == "" or any(ch.isspace() or ch in '"=' for ch in text):
        return json.dumps(text)
    return text


class TextFormatter(logging.Formatter):
    """`<UTC time> <LEVEL> <event> key=value ...`, readable by people and by grep."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        millis = int(record.msecs)
        fields = getattr(record, _FIELDS, {})
        parts = [f"{stamp}.{millis:03d}Z", record.levelname, record.getMessage()]
        parts.extend(f"{key}={_format_value(value)}" for key, value in fields.items())
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line: `ts`, `level`, `event`, `logger`, then the fields."""

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "event": record.getMessage(),
            "logger": record.name,
        }
        for key, value in getattr(record, _FIELDS, {}).items():
            payload[key] = value if isinstance(value, (int, float, bool)) else _jsonable(value)
        if record.exc_info:
            payload["exception"] = self.formatException(record.exc_info)
        return json.dumps(payload, separators=(",", ":"))


def _jsonable(value: Any) -> Any:
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _jsonable(item) for key, item in value.items()}
    if value is None:
        return None
    return str(value)


def configure(log_format: LogFormat = "text", level: int = logging.INFO) -> None:
    """Send the package's logs to stderr in the chosen format (idempotent)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(level)
    for noisy in ("watchdog", "grpc", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
