"""PyYAML, imported without the regex its pure-Python reader compiles at import.

`yaml.reader` compiles `Reader.NON_PRINTABLE`, a character class over most of Unicode, when it
is imported: about 4 ms, the largest single import cost of `serve`'s start that a bare gRPC
server does not pay. Only the pure-Python reader uses it, to refuse unprintable input; the
libyaml loaders, which every parse here prefers (CSafeLoader), never do. Imported through this
module, the class is compiled on its first use instead. Import `yaml` from here; once yaml is
loaded, from anywhere, this module changes nothing.
"""

from __future__ import annotations

import re
import sys
from typing import Any

__all__ = ["yaml"]

_NON_PRINTABLE = "[^\x09\x0a\x0d\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]"


class _CompiledOnFirstUse:
    """Stands for `re.compile(pattern, flags)` until a method of it is first called."""

    def __init__(self, pattern: str, flags: int) -> None:
        self._pattern, self._flags = pattern, flags
        self._compiled: re.Pattern[str] | None = None

    def __getattr__(self, name: str) -> Any:
        if self._compiled is None:
            self._compiled = re.compile(self._pattern, self._flags)
        return getattr(self._compiled, name)


def _compile_deferring_non_printable(pattern: Any, flags: Any = 0) -> Any:
    if pattern == _NON_PRINTABLE:
        return _CompiledOnFirstUse(pattern, flags)
    return _compile(pattern, flags)


_compile = re.compile
if "yaml" not in sys.modules:
    re.compile = _compile_deferring_non_printable
try:
    import yaml
finally:
    re.compile = _compile
