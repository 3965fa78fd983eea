#!/usr/bin/env bash
# Prepares this host (Debian bookworm, root) for the end-to-end container tests.
#
#   sudo e2e/setup-host.sh
#
# Idempotent: every step checks first and does nothing when its result is already there.
#   1. installs the `images` packages of e2e/host-packages.txt (podman, runc, mmdebstrap,
#      busybox-static, catatonit) that are missing, through e2e/host-packages.sh;
#   2. makes podman use runc (crun refuses this machine's hybrid cgroup layout) and drops the
#      default ulimits (setting RLIMIT_NOFILE fails here with "operation not permitted"), in
#      /etc/containers/containers.conf, keeping every other setting that file holds;
#   3. builds a Debian bookworm root file system with Python 3 (mmdebstrap, cached as a tarball
#      under $E2E_CACHE) and imports it as localhost/deviceplugin-e2e-base:bookworm;
#   4. makes a 2 MB busybox image, localhost/deviceplugin-e2e-busybox:latest, for workloads;
#   5. creates /var/run/cdi (empty) so a test can bind a private spec directory over it in its
#      own mount namespace; /run is a tmpfs, so tests should `mkdir -p /var/run/cdi` as well.
# No registry is needed: both images are made locally.
#
# Environment:
#   E2E_CACHE        cache directory (default /var/cache/deviceplugin-e2e)
#   E2E_BASE_IMAGE   base image name (default localhost/deviceplugin-e2e-base:bookworm)
#   E2E_BUSYBOX_IMAGE busybox image name (default localhost/deviceplugin-e2e-busybox:latest)
#   E2E_SUITE        Debian suite of the base (default bookworm)
#   E2E_MIRROR       Debian mirror for mmdebstrap (default: mmdebstrap's own default)
#   E2E_REBUILD=1    rebuild the base tarball and both images even when they exist
set -euo pipefail

E2E_CACHE=${E2E_CACHE:-/var/cache/deviceplugin-e2e}
E2E_SUITE=${E2E_SUITE:-bookworm}
E2E_BASE_IMAGE=${E2E_BASE_IMAGE:-localhost/deviceplugin-e2e-base:${E2E_SUITE}}
E2E_BUSYBOX_IMAGE=${E2E_BUSYBOX_IMAGE:-localhost/deviceplugin-e2e-busybox:latest}
E2E_MIRROR=${E2E_MIRROR:-}
E2E_REBUILD=${E2E_REBUILD:-0}
CONTAINERS_CONF=${CONTAINERS_CONF_PATH:-/etc/containers/containers.conf}
BASE_PACKAGES=python3,python3-venv,python3-pip,python-is-python3

log() { printf '[setup-host] %s\n' "$*"; }
die() { printf '[setup-host] error: %s\n' "$*" >&2; exit 1; }

now() { date +%s.%N; }
# step NAME CMD...: runs CMD, then prints how long it took.
step() {
    local name=$1 start end
    shift
    start=$(now)
    "$@"
    end=$(now)
    awk -v n="$name" -v a="$start" -v b="$end" \
        'BEGIN { printf "[setup-host] -- %-16s %6.1f s\n", n, b - a }'
}

if [ "$(id -u)" -ne 0 ]; then
    die "must run as root (uid 0), not uid $(id -u): it installs packages, writes /etc/containers and stores root's podman images. Run: sudo $0"
fi
command -v apt-get >/dev/null || die "apt-get not found: this script supports Debian hosts only"

# --- 1. packages ------------------------------------------------------------------------------
install_packages() {
    "$(dirname "$0")/host-packages.sh" images
    log "packages: $(podman --version), $(runc --version | head -n1)"
}

# --- 2. containers.conf -----------------------------------------------------------------------
# Sets [containers] default_ulimits = [] and [engine] runtime = "runc" unless the file already
# says so; edits only those two keys (replacing them in place, or adding them to their table, or
# adding the table), keeps every other line, then checks the result parses as TOML.
configure_containers() {
    local py
    py=$(command -v /usr/bin/python3 || command -v python3) \
        || die "python3 is needed to edit $CONTAINERS_CONF"
    "$py" -c 'import tomllib' 2>/dev/null || die "$py has no tomllib (needs Python 3.11+)"
    mkdir -p "$(dirname "$CONTAINERS_CONF")"
    "$py" - "$CONTAINERS_CONF" <<'PY'
import os, re, sys, tomllib

path = sys.argv[1]
wanted = [("containers", "default_ulimits", [], "[]"), ("engine", "runtime", "runc", '"runc"')]
text = open(path).read() if os.path.exists(path) else ""
try:
    conf = tomllib.loads(text)
except tomllib.TOMLDecodeError as err:
    sys.exit(f"[setup-host] error: {path} is not valid TOML ({err}); fix it by hand")
todo = [w for w in wanted if conf.get(w[0], {}).get(w[1], object()) != w[2]]
if not todo:
    print(f"[setup-host] containers.conf: {path} already sets default_ulimits = [] and runtime = \"runc\"")
    sys.exit(0)

lines = text.splitlines()
header = re.compile(r"^\s*\[\s*([A-Za-z0-9_.\"-]+)\s*\]\s*(#.*)?$")
for table, key, _, literal in todo:
    keyline = re.compile(r"^\s*" + re.escape(key) + r"\s*=")
    current, start, done = None, None, False
    for i, line in enumerate(lines):
        m = header.match(line)
        if m:
            current = m.group(1).strip('"')
            if current == table and start is None:
                start = i
            continue
        if current == table and keyline.match(line):
            # A multi-line array value continues until its brackets balance.
            end = i
            depth = line.split("#", 1)[0].count("[") - line.split("#", 1)[0].count("]")
            while depth > 0 and end + 1 < len(lines):
                end += 1
                depth += lines[end].count("[") - lines[end].count("]")
            lines[i:end + 1] = [f"{key} = {literal}"]
            done = True
            break
    if not done:
        if start is None:
            if lines and lines[-1].strip():
                lines.append("")
            lines += [f"[{table}]", f"{key} = {literal}"]
        else:
            lines.insert(start + 1, f"{key} = {literal}")
    print(f"[setup-host] containers.conf: set [{table}] {key} = {literal}")

new = "\n".join(lines) + "\n"
check = tomllib.loads(new)
assert all(check[t][k] == v for t, k, v, _ in wanted), check
tmp = path + ".setup-host.tmp"
with open(tmp, "w") as f:
    f.write(new)
if os.path.exists(path):
    os.chmod(tmp, os.stat(path).st_mode & 0o7777)
os.replace(tmp, path)
print(f"[setup-host] containers.conf: wrote {path}")
PY
}

# --- 3. base image ----------------------------------------------------------------------------
image_exists() { podman image exists "$1"; }

build_base_tarball() {
    local tarball=$E2E_CACHE/base-$E2E_SUITE.tar
    if [ -f "$tarball" ] && [ -s "$tarball" ] && [ "$E2E_REBUILD" != 1 ]; then
        log "base tarball: cached $tarball ($(du -sh "$tarball" | cut -f1))"
        return
    fi
    mkdir -p "$E2E_CACHE"
    log "base tarball: mmdebstrap --variant=minbase --include=$BASE_PACKAGES $E2E_SUITE"
    # The temporary name must end in .tar: mmdebstrap picks its output format from the name and
    # writes a directory for anything else (--format=tar makes that explicit as well).
    local tmp=$E2E_CACHE/.base-$E2E_SUITE.tmp$$.tar
    trap 'rm -f "$tmp"' EXIT
    # shellcheck disable=SC2086  # E2E_MIRROR is empty or one URL
    mmdebstrap --quiet --format=tar --variant=minbase --include="$BASE_PACKAGES" \
        "$E2E_SUITE" "$tmp" $E2E_MIRROR
    mv -f "$tmp" "$tarball"
    trap - EXIT
    log "base tarball: wrote $tarball ($(du -sh "$tarball" | cut -f1))"
}

import_base_image() {
    local tarball=$E2E_CACHE/base-$E2E_SUITE.tar
    if image_exists "$E2E_BASE_IMAGE" && [ "$E2E_REBUILD" != 1 ]; then
        log "base image: $E2E_BASE_IMAGE already exists"
        return
    fi
    podman import --quiet --change 'CMD ["/bin/bash"]' --change 'ENV LANG=C.UTF-8' \
        "$tarball" "$E2E_BASE_IMAGE" >/dev/null
    log "base image: imported $E2E_BASE_IMAGE ($(podman run --rm --network none \
        "$E2E_BASE_IMAGE" python3 --version))"
}

# --- 4. busybox image -------------------------------------------------------------------------
build_busybox_image() {
    if image_exists "$E2E_BUSYBOX_IMAGE" && [ "$E2E_REBUILD" != 1 ]; then
        log "busybox image: $E2E_BUSYBOX_IMAGE already exists"
        return
    fi
    local busybox=/bin/busybox tree applet
    [ -x "$busybox" ] || die "$busybox missing although busybox-static is installed"
    if ldd "$busybox" >/dev/null 2>&1; then
        die "$busybox is dynamically linked (the busybox package?): install busybox-static"
    fi
    tree=$(mktemp -d)
    trap 'rm -rf "$tree"' EXIT
    mkdir -p "$tree"/{bin,dev,etc,proc,sys,tmp,root,run,var/tmp}
    chmod 1777 "$tree/tmp" "$tree/var/tmp"
    cp "$busybox" "$tree/bin/busybox"
    for applet in $("$busybox" --list); do
        [ "$applet" = busybox ] || ln -sf busybox "$tree/bin/$applet"
    done
    ln -s bin "$tree/sbin"
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' \
        >"$tree/etc/passwd"
    printf 'root:x:0:\nnogroup:x:65534:\n' >"$tree/etc/group"
    tar --numeric-owner --owner=0 --group=0 -C "$tree" -cf - . \
        | podman import --quiet --change 'CMD ["/bin/sh"]' --change 'ENV PATH=/bin' \
            - "$E2E_BUSYBOX_IMAGE" >/dev/null
    rm -rf "$tree"
    trap - EXIT
    log "busybox image: imported $E2E_BUSYBOX_IMAGE ($("$busybox" | head -n1 | cut -d' ' -f1-2))"
}

# --- 5. CDI spec directory -------------------------------------------------------------------
cdi_dir() {
    if [ -d /var/run/cdi ]; then
        log "cdi: /var/run/cdi exists ($(find /var/run/cdi -maxdepth 1 -type f | wc -l) files)"
    else
        mkdir -p /var/run/cdi
        log "cdi: created /var/run/cdi (a mount point for private spec directories)"
    fi
    if [ -d /etc/cdi ] && [ -n "$(ls -A /etc/cdi)" ]; then
        log "cdi: warning: /etc/cdi holds specs; podman merges them with /var/run/cdi: $(ls /etc/cdi)"
    fi
}

total_start=$(now)
step "packages" install_packages
step "containers.conf" configure_containers
step "base tarball" build_base_tarball
step "base image" import_base_image
step "busybox image" build_busybox_image
step "cdi dir" cdi_dir
log "$(awk -v a="$total_start" -v b="$(now)" 'BEGIN { printf "all done in %.1f s", b - a }')"
podman images --filter reference='localhost/deviceplugin-e2e-*' \
    --format '  {{.Repository}}:{{.Tag}}  {{.Size}}'
