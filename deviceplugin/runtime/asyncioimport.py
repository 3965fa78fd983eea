"""asyncio, imported without `ssl`: OpenSSL's libraries load only once something speaks TLS.

asyncio imports `ssl` for its TLS transports (`create_connection(ssl=...)`, `start_tls`), and
`ssl` loads OpenSSL's libcrypto and libssl: about 4.4 MiB of RSS and 40 ms of a daemon's
start, the largest piece of `serve` beyond gRPC itself. Neither daemon needs it to start: the
kubelet's and the plugins' gRPC run on unix sockets (and gRPC carries its own TLS), and the
Kubernetes client is the one TLS speaker. So the entry point imports asyncio through this
module, with `ssl` hidden while asyncio loads (asyncio reads the ImportError as "no TLS here"),
and `with_tls()`, called where the Kubernetes client is imported, loads `ssl` and hands it to
asyncio's TLS modules, so that from then on TLS works as if asyncio had loaded it itself. Once
asyncio is loaded, from anywhere, importing this module changes nothing.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["with_tls"]


def _import_asyncio_without_ssl() -> None:
    if "asyncio" in sys.modules or "ssl" in sys.modules:
        return
    sys.modules["ssl"] = None  # type: ignore[assignment]  # `import ssl` raises ImportError
    try:
        import asyncio  # noqa: F401
    finally:
        del sys.modules["ssl"]


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


_import_asyncio_without_ssl()
