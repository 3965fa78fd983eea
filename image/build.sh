#!/usr/bin/env bash
# Build the plugin's image where the build containers reach no package index and no registry.
#
#   image/build.sh TOOL BASE_IMAGE IMAGE VERSION PYTHON [EXTRAS]
#
# EXTRAS is a pip extras suffix such as `[dra]` (the DRA driver's image); none by default.
#
# The wheels are made here, on the host, with this machine's pip settings (index, proxy, CA),
# for the Python of the base image (asked from the base itself, so a base with another Python
# version gets wheels it can install). The Dockerfile installs them with --no-index: the build
# needs no network, and `--network none` proves it.
set -euo pipefail

tool=$1 base=$2 image=$3 version=$4 python=$5 extras=${6:-}
here=$(cd "$(dirname "$0")/.." && pwd)
wheels="$here/build/wheels"

if ! "$tool" image exists "$base" 2>/dev/null && ! "$tool" image inspect "$base" >/dev/null 2>&1; then
    echo "image: base image $base is not present locally; pull or import it first" >&2
    echo "       (make e2e builds a Debian base with mmdebstrap: e2e/setup-host.sh)" >&2
    exit 2
fi

# cp311 and the machine (x86_64, aarch64) of the base, without starting anything but python.
read -r pyver machine < <("$tool" run --rm --network none --entrypoint python3 "$base" \
    -c 'import platform, sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}", platform.machine())')
echo "image: base $base has Python $pyver on $machine"

rm -rf "$wheels" && mkdir -p "$wheels"
# The simulated libnvidia-ml.so.1 (gcc, the pinned nvml.h), nvidia-cuda-mps-control and
# nvidia-smi go into the wheel, so `sim-root` works in the image, which has no compiler; out of
# the tree again after, so tests here keep building them from the current sources. So does the
# DRA driver's memory-limit hook (C: a createContainer hook runs on the host's loader, where only
# the image has Python), which the driver copies onto the node at start.
packaged="$here/deviceplugin/sim/native/libnvidia-ml.so.1"
hook="$here/deviceplugin/node/native/memory-limit-hook"
packaged_mps="$here/deviceplugin/sim/native/nvidia-cuda-mps-control"
packaged_smi="$here/deviceplugin/sim/native/nvidia-smi"
trap 'rm -f "$packaged" "$hook" "$packaged_mps" "$packaged_smi"' EXIT
"$python" -m deviceplugin.sim.libbuild --into "$(dirname "$packaged")" --hook-into "$(dirname "$hook")" >/dev/null
"$python" -m pip wheel -q --no-deps --wheel-dir "$wheels" "$here"
rm -f "$packaged" "$hook" "$packaged_mps" "$packaged_smi"
# Binary wheels only, for the base's Python and any manylinux glibc up to Debian bookworm's.
platforms=()
for glibc in 2_17 2_28 2_31 2_34 2_36; do
    platforms+=(--platform "manylinux_${glibc}_${machine}")
done
platforms+=(--platform "manylinux2014_${machine}")
"$python" -m pip download -q --only-binary=:all: --python-version "$pyver" \
    --implementation cp "${platforms[@]}" --dest "$wheels" "$(echo "$wheels"/deviceplugin-*.whl)$extras"

"$tool" build --network none \
    --build-arg "BASE_IMAGE=$base" --build-arg "VERSION=$version" --build-arg "EXTRAS=$extras" \
    -t "$image" -f "$here/Dockerfile" "$here"

base_size=$("$tool" image inspect --format '{{.Size}}' "$base")
image_size=$("$tool" image inspect --format '{{.Size}}' "$image")
added=$(( (image_size - base_size) / 1000000 ))
echo "image: built $image ($("$tool" run --rm --network none --entrypoint deviceplugin "$image" --version)), ${added} MB on top of $base"
