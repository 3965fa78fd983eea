"""deviceplugin.model.yamlimport: PyYAML loads without compiling its reader's regex, and parses
and refuses input exactly as before."""

from __future__ import annotations

import subprocess
import sys

import pytest

from deviceplugin.model.yamlimport import yaml

FRESH_IMPORT = """
import re
compile_before = re.compile
import deviceplugin.model.config_keys  # the first yaml import on serve's path
import yaml
print(type(yaml.reader.Reader.NON_PRINTABLE).__name__, re.compile is compile_before)
"""


def test_a_fresh_serve_path_import_leaves_the_reader_regex_for_later() -> None:
    done = subprocess.run(
        [sys.executable, "-c", FRESH_IMPORT], capture_output=True, text=True, check=True
    )
    # A PyYAML whose reader compiles another pattern shows here as a compiled `Pattern`.
    assert done.stdout.split() == ["_CompiledOnFirstUse", "True"]


def test_the_pure_python_reader_still_refuses_unprintable_input() -> None:
    with pytest.raises(yaml.reader.ReaderError, match="#x0007: special characters"):
        yaml.load("key: \x07", Loader=yaml.SafeLoader)
    assert yaml.load("key: é ✓", Loader=yaml.SafeLoader) == {"key": "é ✓"}


def test_the_libyaml_loader_parses_as_before() -> None:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    assert yaml.load("a: [1, 2.5, true, null]", Loader=loader) == {"a": [1, 2.5, True, None]}
