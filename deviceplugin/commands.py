"""One-shot commands that do not serve: `validate-config`."""

from __future__ import annotations

import sys

from deviceplugin.cli import Settings
from deviceplugin.model.config import parse_config, summary
from deviceplugin.model.config_keys import read_text
from deviceplugin.model.errors import ConfigError


def validate_config(settings: Settings) -> int:
    """Exit 0 with a one-line summary when FILE is valid; 2 naming the offending field if not."""
    path = settings.path or ""
    try:
        parsed = parse_config(read_text(path), source=path)
    except ConfigError as exc:
        # Read and syntax errors already name the file; a field error names only the field.
        message = str(exc) if str(exc).startswith(path) else f"{path}: {exc}"
        print(f"invalid: {message}", file=sys.stderr)
        return 2
    for warning in parsed.warnings:
        print(f"{path}: warning: {warning}", file=sys.stderr)
    print(f"{path}: {summary(parsed.config)}")
    return 0
