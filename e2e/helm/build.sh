#!/usr/bin/env bash
# Builds Helm (the version go.mod pins) from the Go module proxy into a cache outside the clone,
# links it at e2e/cluster/run/bin/helm beside the cluster's other tools, and prints its path:
#
#   e2e/helm/build.sh     # -> /var/cache/deviceplugin-e2e/helm/<key>/bin/helm
#
# The folder is keyed by a hash of go.mod, go.sum and this script, so a second run builds
# nothing. GOCACHE and GOMODCACHE are Go's own, outside the clone. Needs only Go (static build,
# no C compiler). Environment: E2E_HELM_CACHE (default /var/cache/deviceplugin-e2e/helm).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache=${E2E_HELM_CACHE:-/var/cache/deviceplugin-e2e/helm}
export GOTOOLCHAIN=${GOTOOLCHAIN:-auto}
export GOFLAGS="${GOFLAGS:-} -buildvcs=false"

key=$(cat "$here/go.mod" "$here/go.sum" "$0" | sha256sum | cut -c1-16)
helm=$cache/$key/bin/helm
link_dir=$here/../cluster/run/bin

log() { printf '[helm build] %s\n' "$*" >&2; }

if [ ! -x "$helm" ]; then
    if ! command -v go >/dev/null; then
        log "go is missing (Go $(sed -n 's/^go \([0-9.]*\)$/\1/p' "$here/go.mod") or newer, from go.dev)"
        exit 1
    fi
    cd "$here"
    version=$(go list -m -f '{{.Version}}' helm.sh/helm/v4)
    start=$(date +%s)
    log "helm $version ..."
    mkdir -p "$(dirname "$helm")"
    # Helm's Makefile: static, stripped, the version stamped where `helm version` reads it.
    CGO_ENABLED=0 go build -trimpath \
        -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$version" \
        -o "$helm.tmp" helm.sh/helm/v4/cmd/helm
    mv "$helm.tmp" "$helm"
    log "helm $version: $(( $(date +%s) - start )) s"
fi
mkdir -p "$link_dir"
ln -sfn "$helm" "$link_dir/helm"
echo "$helm"
