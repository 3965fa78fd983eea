"""Libraries imported without the parts no daemon here uses to start: asyncio without `ssl`,
httpcore without HTTP/2, and lightkube's typed core/v1 models run only when first used. The
first two are optional imports, which the library reads an ImportError of as "not
available"; each would cost a daemon's start more than the modules it needs.

- asyncio imports `ssl` for its TLS transports (`create_connection(ssl=...)`, `start_tls`),
  and `ssl` loads OpenSSL's libcrypto and libssl: about 4.4 MiB of RSS and 40 ms of a
  daemon's start, the largest piece of `serve` beyond gRPC itself. Neither daemon needs it to
  start: the kubelet's and the plugins' gRPC run on unix sockets (gRPC carries its own TLS),
  and the Kubernetes client is the one TLS speaker. So the entry point imports this module
  first, which imports asyncio with `ssl` hidden; `with_tls()`, called where the Kubernetes
  client is imported, loads `ssl` and hands it to asyncio's TLS modules, so that from then on
  TLS works as if asyncio had loaded it itself.
- httpcore imports h2 (with hpack and hyperframe) for HTTP/2 connections, which only a client
  made with `http2=True` opens; ours never is. `without_http2()` imports httpcore with h2
  hidden: about a tenth of the client's import (`-X importtime`), before `dra serve`'s first
  publish.
- Modules the Kubernetes client's library imports at the top and uses only on a path the
  daemons never take (`DEFERRED`): lightkube's typed core/v1 models and resources (we use
  generic resources; lightkube reads them to stream a Pod's log). `deferring()` imports them
  as `importlib.util.LazyLoader` does: the module is made at once and its code runs on first
  attribute use: another 7% of the client's import.

Once a library is loaded, from anywhere, hiding its optional import changes nothing.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

__all__ = ["deferring", "with_tls", "without_http2"]

DEFERRED = frozenset({"lightkube.models.core_v1", "lightkube.resources.core_v1"})


class _Deferring(importlib.abc.MetaPathFinder):
    """Finds the modules in DEFERRED as the path finder does, with a lazy loader."""

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if name not in DEFERRED:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = importlib.util.LazyLoader(spec.loader)
        return spec


@contextmanager
def deferring() -> Iterator[None]:
    """Inside, a module of DEFERRED imported for the first time runs on first use."""
    finder = _Deferring()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


@contextmanager
def _hidden(name: str) -> Iterator[None]:
    """Inside, `import name` raises ImportError (unless `name` is loaded already)."""
    if name in sys.modules:
        yield
        return
    sys.modules[name] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        del sys.modules[name]


def with_tls() -> None:
    """Load `ssl` and give it to asyncio's TLS transports, if they were loaded without it."""
    import ssl
    from asyncio import base_events, selector_events, sslproto

    proto: Any = sslproto  # the module globals asyncio set when its `import ssl` failed
    if proto.ssl is None:
        modules: tuple[Any, ...] = (base_events, selector_events, proto)
        for module in modules:
            module.ssl = ssl
        proto.SSLAgainErrors = (ssl.SSLWantReadError, ssl.SSLSyscallError)


def without_http2() -> None:
    """Import httpcore (httpx's transport) without h2: HTTP/1.1 connections only."""
    with _hidden("h2"):
        import httpcore2  # noqa: F401


if "asyncio" not in sys.modules:
    with _hidden("ssl"):
        import asyncio  # noqa: F401
