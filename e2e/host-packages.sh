#!/usr/bin/env bash
# Installs the host packages that GROUP... needs (e2e/host-packages.txt), only those missing.
#
#   e2e/host-packages.sh build node images   # installs what is missing (root, apt-get)
#   e2e/host-packages.sh --check build       # exit 1 naming what is missing; installs nothing
#
# Without root or apt-get, or with --check, a missing package is named in one line with the
# command that installs it, and the script fails at once: before a target's long build, not
# after it. Installs go without recommends (podman's would pull crun, which fails here), with
# one `apt-get update` first, only when something is to be installed.
set -euo pipefail

list=$(dirname "$0")/host-packages.txt
check_only=0
if [ "${1:-}" = --check ]; then
    check_only=1
    shift
fi
[ $# -gt 0 ] || { echo "usage: $0 [--check] GROUP..." >&2; exit 2; }

wanted=()
for group in "$@"; do
    names=$(awk -v g="$group" '!/^#/ && NF >= 2 && $2 == g { print $1 }' "$list")
    [ -n "$names" ] || { echo "host-packages: no group '$group' in $list" >&2; exit 2; }
    # shellcheck disable=SC2206  # one package name per word
    wanted+=($names)
done

missing=()
for pkg in "${wanted[@]}"; do
    # dpkg's status, not a command: a package removed but not purged still has a status entry.
    if [ "$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)" != installed ]; then
        missing+=("$pkg")
    fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

install="apt-get install -y --no-install-recommends ${missing[*]}"
if [ "$check_only" = 1 ] || [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
    echo "host-packages: missing for '$*': ${missing[*]}; install them with: sudo $install" >&2
    exit 1
fi
echo "host-packages: installing ${missing[*]} (for '$*')" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086  # one package name per word
apt-get install -y -qq --no-install-recommends ${missing[*]} >/dev/null
echo "host-packages: installed ${missing[*]}" >&2
