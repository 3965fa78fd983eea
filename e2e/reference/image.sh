#!/usr/bin/env bash
# The reference device plugin's image: NVIDIA's binary, built unmodified by build.sh, on the local
# Debian base the cluster's other images use (no registry, no pull), so it can run on the real
# cluster beside ours (e2e/cluster/test_reference.py). Root (podman).
#
#   e2e/reference/image.sh BASE_IMAGE IMAGE
set -euo pipefail
base=$1
image=$2
here=$(cd "$(dirname "$0")" && pwd)
bin=$("$here/build.sh")
context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
cp "$bin/nvidia-device-plugin" "$context/"
cat >"$context/Containerfile" <<CONTAINERFILE
FROM $base
COPY nvidia-device-plugin /usr/bin/nvidia-device-plugin
ENTRYPOINT ["/usr/bin/nvidia-device-plugin"]
CONTAINERFILE
podman build --quiet --tag "$image" "$context" >/dev/null
echo "[reference image] $image: $("$bin/nvidia-device-plugin" --version 2>&1 | head -1)"
