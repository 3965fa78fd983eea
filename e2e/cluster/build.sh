#!/usr/bin/env bash
# Builds the real node's components of one pinned Kubernetes version and prints the folder that
# holds them:
#
#   e2e/cluster/build.sh [VERSION] [--check]    # VERSION: argument, else $KUBERNETES_VERSION,
#                                               # else the default (the version of ./go.mod)
#
# Each version is a Go module of its own: the default one is ./go.mod, every other one
# versions/<minor>/go.mod. build-module.sh builds one module and keys its cache by a hash of
# that module's go.mod, go.sum and build-module.sh itself (each version folder links to it),
# so every version has its own cache folder and the default's key is the one it always had.
#
# A version that is not pinned exits 2 before anything is built, naming the ones that are.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)

# The minor (1.37) of the k8s.io/kubernetes a module pins.
minor_of() { sed -n 's|^[[:space:]]*k8s.io/kubernetes v\(1\.[0-9]*\)\..*|\1|p' "$1/go.mod" | head -n1; }

declare -A module
default=$(minor_of "$here")
module[$default]=$here
for dir in "$here"/versions/*/; do
    dir=${dir%/}
    module[$(minor_of "$dir")]=$dir
done
pinned=$(printf '%s\n' "${!module[@]}" | sort -V)
pinned=${pinned//$'\n'/ }

args=()
version=${KUBERNETES_VERSION:-}
for arg in "$@"; do
    case $arg in
        --*) args+=("$arg") ;;
        *) version=$arg ;;
    esac
done
version=${version:-$default}
version=${version#v}
if [ -z "${module[$version]:-}" ]; then
    printf '[cluster build] Kubernetes version %q is not pinned; pinned: %s\n' \
        "$version" "$pinned" >&2
    exit 2
fi
exec "${module[$version]}/build-module.sh" "${args[@]}"
