"""Generate the committed Python gRPC stubs from the .proto files in this folder.

    python protos/generate.py [OUTPUT_ROOT]

Stubs land under OUTPUT_ROOT (default: the repository root) as deviceplugin/wire/<api>/..., the
package every layer may import and that imports nothing else of ours; each proto's path below
protos/ is its package's, so the stubs' own imports (`from deviceplugin.wire.<api> import
api_pb2`) resolve. The test suite generates into a temp dir and compares byte for byte with what
is committed.
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpc_tools import protoc

PROTO_ROOT = Path(__file__).resolve().parent
REPO_ROOT = PROTO_ROOT.parent
PROTOS = (
    "deviceplugin/wire/deviceplugin/v1beta1/api.proto",
    "deviceplugin/wire/podresources/v1/api.proto",
    "deviceplugin/wire/dra/v1/api.proto",
    "deviceplugin/wire/dra/v1beta1/api.proto",
    "deviceplugin/wire/pluginregistration/v1/api.proto",
    "deviceplugin/wire/drahealth/v1alpha1/api.proto",
    "deviceplugin/wire/drahealth/v1/api.proto",
)


def generate(output_root: Path) -> list[Path]:
    """Run protoc on every proto that exists; return the generated files."""
    written: list[Path] = []
    for proto in PROTOS:
        if not (PROTO_ROOT / proto).exists():
            continue
        code = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{PROTO_ROOT}",
                f"--python_out={output_root}",
                f"--pyi_out={output_root}",
                f"--grpc_python_out={output_root}",
                str(PROTO_ROOT / proto),
            ]
        )
        if code != 0:
            raise SystemExit(f"protoc failed on {proto}")
        package_dir = output_root / Path(proto).parent
        init = package_dir / "__init__.py"
        if not init.exists():
            init.write_text('"""Generated gRPC stubs; regenerate with `make protos`."""\n')
        written.extend(sorted(package_dir.glob("api_pb2*")))
    return written


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else REPO_ROOT)
