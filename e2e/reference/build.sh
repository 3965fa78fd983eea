#!/usr/bin/env bash
# Builds NVIDIA's own components, unmodified, from the Go module proxy into a cache outside the
# clone, and prints the folder that holds them:
#
#   e2e/reference/build.sh     # -> ~/.cache/deviceplugin/reference/<key>/bin
#
#   bin/nvidia-device-plugin   the reference device plugin (device-plugin/go.mod)
#   bin/mps-control-daemon     its MPS control daemon, which it needs to advertise MPS resources
#                              (the same)
#   bin/gpu-kubelet-plugin     NVIDIA's DRA kubelet plugin (dra-driver/go.mod)
#   bin/nvidia-ctk             the container toolkit's CLI (nvidia-ctk/go.mod)
#   bin/nvidia-cdi-hook        its CDI hook, which the DRA kubelet plugin insists on (the same)
#   templates/                 the DRA kubelet plugin's pod templates (its image has them at
#                              /templates; an MPS claim's daemon is made from one), as pinned
#
# Each has a go.mod of its own, so each is built with the dependency versions its own project
# pins (one shared module would let Go's version selection mix them). The folder is keyed by a
# hash of the three go.mod and go.sum files and this script, so a second run builds nothing.
# Needs Go and gcc (go-nvml loads libnvidia-ml.so.1 through cgo), no root.
# Environment: E2E_REFERENCE_CACHE (default ${XDG_CACHE_HOME:-~/.cache}/deviceplugin/reference).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache=${E2E_REFERENCE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/deviceplugin/reference}
export GOTOOLCHAIN=${GOTOOLCHAIN:-auto}
export GOFLAGS="${GOFLAGS:-} -buildvcs=false"
# go-nvml's cgo wrappers call every function nvml.h declares, deprecated ones included.
export CGO_CFLAGS="${CGO_CFLAGS:--O2 -g} -Wno-deprecated-declarations"

components=(
    "device-plugin github.com/NVIDIA/k8s-device-plugin cmd/nvidia-device-plugin"
    "device-plugin github.com/NVIDIA/k8s-device-plugin cmd/mps-control-daemon"
    "dra-driver sigs.k8s.io/dra-driver-nvidia-gpu cmd/gpu-kubelet-plugin"
    "nvidia-ctk github.com/NVIDIA/nvidia-container-toolkit cmd/nvidia-ctk"
    "nvidia-ctk github.com/NVIDIA/nvidia-container-toolkit cmd/nvidia-cdi-hook"
)

key=$(cat "$here"/*/go.mod "$here"/*/go.sum "$0" | sha256sum | cut -c1-16)
bin=$cache/$key/bin

log() { printf '[reference build] %s\n' "$*" >&2; }

for tool in go gcc; do
    if ! command -v "$tool" >/dev/null; then
        log "$tool is missing: building NVIDIA's components needs Go (go.dev) and gcc (apt-get install gcc libc6-dev)"
        exit 1
    fi
done

mkdir -p "$bin"
for component in "${components[@]}"; do
    read -r dir module package <<<"$component"
    name=$(basename "$package")
    [ -x "$bin/$name" ] && continue
    cd "$here/$dir"
    version=$(go list -m -f '{{.Version}}' "$module")
    start=$(date +%s)
    log "$name $version ..."
    # The version stamped where each reports it (their Makefiles' -X flags).
    case $name in
        nvidia-device-plugin | mps-control-daemon) stamp="-X github.com/NVIDIA/k8s-device-plugin/internal/info.version=$version" ;;
        gpu-kubelet-plugin) stamp="-X sigs.k8s.io/dra-driver-nvidia-gpu/internal/info.version=$version" ;;
        nvidia-ctk | nvidia-cdi-hook) stamp="-X github.com/NVIDIA/nvidia-container-toolkit/internal/info.version=$version" ;;
    esac
    go build -trimpath -ldflags "-s -w $stamp" -o "$bin/$name.tmp" "$module/$package"
    mv "$bin/$name.tmp" "$bin/$name"
    log "$name $version: $(( $(date +%s) - start )) s"
done

templates=$cache/$key/templates
if [ ! -f "$templates/mps-control-daemon.tmpl.yaml" ]; then
    source=$(cd "$here/dra-driver" && go list -m -f '{{.Dir}}' sigs.k8s.io/dra-driver-nvidia-gpu)
    rm -rf "$templates.tmp" && mkdir -p "$templates.tmp"
    cp "$source"/templates/* "$templates.tmp"/ && chmod -R u+w "$templates.tmp"
    mv "$templates.tmp" "$templates"
fi
echo "$bin"
