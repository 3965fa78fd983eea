#!/usr/bin/env bash
# Saves the images the cluster runs from podman's store into archives that `cluster up` imports
# into containerd (no registry is involved). An archive is rewritten only when its image changed.
#
#   e2e/cluster/save-images.sh IMAGE...
set -euo pipefail
dir=${E2E_CLUSTER_IMAGES:-/var/cache/deviceplugin-e2e/images}
mkdir -p "$dir"
for image in "$@"; do
    id=$(podman image inspect --format '{{.Id}}' "$image")
    name=$(printf '%s' "$image" | tr '/:' '__')
    if [ -f "$dir/$name.tar" ] && [ "$(cat "$dir/$name.id" 2>/dev/null)" = "$id" ]; then
        echo "[save-images] $image unchanged"
        continue
    fi
    rm -f "$dir/$name.tar"
    podman save --quiet --format docker-archive -o "$dir/$name.tar.tmp" "$image"
    mv "$dir/$name.tar.tmp" "$dir/$name.tar"
    echo "$id" >"$dir/$name.id"
    echo "[save-images] $image -> $dir/$name.tar"
done
