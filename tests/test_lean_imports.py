"""Libraries loaded without what no daemon uses (`runtime/leanimports.py`), as the entry point
loads them: asyncio without `ssl`, so the daemons start without OpenSSL, and TLS still works
once the Kubernetes client is imported, on asyncio's own TLS transports too; httpcore without
h2. Each case runs in a fresh interpreter, where asyncio is not loaded yet (pytest's own
process has it, with `ssl`)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parent


def _fresh(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60
    )


def test_asyncio_loads_without_ssl_and_ssl_stays_importable() -> None:
    done = _fresh(
        "import sys\n"
        "import deviceplugin.runtime.leanimports\n"
        "import asyncio, asyncio.sslproto\n"
        "assert 'ssl' not in sys.modules, 'asyncio loaded ssl'\n"
        "assert asyncio.sslproto.ssl is None\n"
        "import ssl\n"
        "print(ssl.OPENSSL_VERSION)\n"
    )
    assert done.returncode == 0, done.stderr
    assert "OpenSSL" in done.stdout


def test_the_kubernetes_client_runs_its_deferred_modules_only_when_used() -> None:
    """After a call to an API server, lightkube's typed core/v1 models are still unrun; used,
    they run as if imported at once."""
    done = _fresh(
        "import asyncio, sys\n"
        "import deviceplugin.runtime.leanimports\n"
        "from deviceplugin.runtime.kubeclient import NODES, KubeError, connect\n"
        "async def call():\n"
        "    client = connect(None, {}, 'http://127.0.0.1:1')\n"
        "    try:\n"
        "        await client.get(NODES, 'n')\n"
        "    except KubeError:\n"
        "        pass\n"
        "    await client.close()\n"
        "asyncio.run(call())\n"
        "from deviceplugin.runtime.leanimports import DEFERRED\n"
        "print(sorted(type(sys.modules[n]).__name__ for n in DEFERRED))\n"
        "from lightkube.resources.core_v1 import Pod\n"
        "print(Pod._api_info.plural, type(sys.modules['lightkube.models.core_v1']).__name__)\n"
    )
    assert done.returncode == 0, done.stderr
    lazy, used = done.stdout.split("\n")[:2]
    assert lazy == str(["_LazyModule"] * 2)
    assert used == "pods module"


def test_the_kubernetes_client_loads_no_http2() -> None:
    done = _fresh(
        "import sys\n"
        "import deviceplugin.runtime.leanimports\n"
        "from deviceplugin.runtime.kubeclient import connect\n"
        "connect(None, {}, 'http://127.0.0.1:1')\n"
        "http2 = ('h2', 'hpack', 'hyperframe')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in http2))\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl to make certificates")
def test_https_works_once_the_kubernetes_client_is_imported(tmp_path: Path) -> None:
    """The kubeclient's HTTPS test, on asyncio loaded without ssl: its server is asyncio's
    TLS transport, its client httpx on anyio."""
    done = _fresh(
        "import sys\n"
        "import deviceplugin.runtime.leanimports\n"
        "assert 'ssl' not in sys.modules\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from pathlib import Path\n"
        "import test_kubeclient\n"
        "test_kubeclient.test_https_is_verified_against_the_clusters_ca(Path(sys.argv[2]))\n",
        str(TESTS),
        str(tmp_path),
    )
    assert done.returncode == 0, done.stderr
