"""Log line formats: text for people and grep, JSON for log pipelines (`--log-format`)."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, Literal

from deviceplugin.model.log import FIELDS

LogFormat = Literal["text", "json"]


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
        fields = getattr(record, FIELDS, {})
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
        for key, value in getattr(record, FIELDS, {}).items():
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
    for noisy in ("grpc", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
