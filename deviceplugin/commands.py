"""One-shot commands that do not serve: `validate-config`."""

from __future__ import annotations

import sys
from pathlib import Path

from deviceplugin.cli import Settings
from deviceplugin.config import parse_config, summary
from deviceplugin.errors import ConfigError


def validate_config(settings: Settings) -> int:
    """Exit 0 with a one-line summary when FILE is valid; 2 naming the offending field if not."""
    path = settings.path or ""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        print(f"{path}: cannot read: {exc.strerror}", file=sys.stderr)
        return 2
    except UnicodeDecodeError:
        print(f"{path}: cannot read: not UTF-8 text", file=sys.stderr)
        return 2
    try:
        parsed = parse_config(text, source=path)
    except ConfigError as exc:
        # A syntax error's message already names the file; a field error names the field.
        print(f"{path}: invalid: {exc}" if exc.path else f"invalid: {exc}", file=sys.stderr)
        return 2
    for warning in parsed.warnings:
        print(f"{path}: warning: {warning}", file=sys.stderr)
    print(f"{path}: {summary(parsed.config)}")
    return 0
