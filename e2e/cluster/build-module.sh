#!/usr/bin/env bash
# Builds the real node's components from source into a cache outside the clone and prints the
# folder that holds them:
#
#   e2e/cluster/build.sh            # -> /var/cache/deviceplugin-e2e/cluster/<key>/bin
#   e2e/cluster/build.sh --check    # only the prerequisite check below
#
# Before building anything it checks its prerequisites (a C compiler, libc for static linking,
# pkg-config, libseccomp, Go) and fails in the first second naming each missing one and its
# Debian package; the `build` group of e2e/host-packages.txt lists the same packages (a test
# keeps the two in step), and `make cluster` installs them first.
#
# Every version is in go.mod (go.sum pins their content): Kubernetes (kube-apiserver,
# kube-controller-manager, kube-scheduler, kubelet, kubectl), etcd, containerd (with ctr and the
# runc shim), runc, crictl and the CNI plugins. The pause binary is compiled from the pinned
# Kubernetes module's own build/pause/linux/pause.c. Everything comes from the Go module proxy;
# nothing else is downloaded.
#
# A tool that does not compile against the libraries the Kubernetes release pins (runc and crictl
# of the older versions) has a module of its own in tools/<name>/, with only its own release's
# requirements, as upstream builds it; the tool is built there, everything else here.
#
# The folder is keyed by a hash of every go.mod and go.sum (tools/ included) and this script, so
# a second run rebuilds nothing (it only checks the binaries are there); GOCACHE and GOMODCACHE
# are Go's own, outside the clone too, so a changed key rebuilds incrementally.
#
# Environment: E2E_CLUSTER_CACHE (default /var/cache/deviceplugin-e2e/cluster), GOFLAGS as usual.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache=${E2E_CLUSTER_CACHE:-/var/cache/deviceplugin-e2e/cluster}
# Go 1.26.8 is enough for every pinned module (each go.mod asks at most 1.26.8). A newer one is
# fetched through the module proxy only if a go line ever asks for it.
export GOTOOLCHAIN=${GOTOOLCHAIN:-auto}
export GOFLAGS="${GOFLAGS:-} -buildvcs=false"

key=$(cat "$here/go.mod" "$here/go.sum" $(find "$here/tools" -name 'go.*' 2>/dev/null | sort) "$0" |
    sha256sum | cut -c1-16)
out=$cache/$key
bin=$out/bin
stamp=$out/.complete

log() { printf '[cluster build] %s\n' "$*" >&2; }

# --- prerequisites: `need KIND WHAT PACKAGE`, one line each ------------------------------------
missing=()
need() {
    local kind=$1 what=$2 package=$3 found=1
    case $kind in
        command) command -v "$what" >/dev/null || found=0 ;;
        # gcc prints the bare name back when it finds no such file.
        gcc-file) local file
            file=$(gcc -print-file-name="$what" 2>/dev/null || true)
            [ "$file" != "$what" ] && [ -f "$file" ] || found=0 ;;
        pkg-config) pkg-config --exists "$what" 2>/dev/null || found=0 ;;
    esac
    [ "$found" = 1 ] || missing+=("$what ($kind; Debian package $package)")
}
check_prerequisites() {
    need command gcc gcc
    need gcc-file libc.a libc6-dev
    need command pkg-config pkg-config
    need pkg-config libseccomp libseccomp-dev
    local wanted have
    wanted=$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$here/go.mod")
    if ! command -v go >/dev/null; then
        missing+=("go (Go $wanted or newer, from go.dev: not a Debian package)")
    else
        have=$(go env GOVERSION 2>/dev/null || true)
        have=${have#go}
        # GOTOOLCHAIN=auto meets a newer go line with a toolchain from the module proxy.
        if [ "$(printf '%s\n%s\n' "$wanted" "$have" | sort -V | head -n1)" != "$wanted" ] &&
            [ "${GOTOOLCHAIN%%+*}" = local ]; then
            missing+=("go $wanted or newer (found go $have with GOTOOLCHAIN=local)")
        fi
    fi
    if [ ${#missing[@]} -gt 0 ]; then
        log "missing prerequisites, nothing built:"
        printf '[cluster build]   %s\n' "${missing[@]}" >&2
        log "install them with: sudo e2e/host-packages.sh build (or make cluster, which does)"
        exit 1
    fi
}

if [ "${1:-}" = --check ]; then
    check_prerequisites
    log "prerequisites: all present"
    exit 0
fi
if [ -f "$stamp" ]; then
    log "cached: $bin"
    echo "$bin"
    exit 0
fi
check_prerequisites

cd "$here"
# The module folder a tool is built in: its own under tools/, else this one.
module_of() { if [ -f "$here/tools/$1/go.mod" ]; then echo "$here/tools/$1"; else echo "$here"; fi; }
version_of() { (cd "$(module_of "${2:-}")" && go list -m -f '{{.Version}}' "$1"); }
k8s=$(version_of k8s.io/kubernetes)
containerd=$(version_of github.com/containerd/containerd/v2)
runc=$(version_of github.com/opencontainers/runc runc)
mkdir -p "$bin/cni"
start=$(date +%s)

step() {
    local what=$1 s
    shift
    s=$(date +%s)
    log "$what ..."
    "$@"
    log "$what: $(( $(date +%s) - s )) s"
}

k8s_ldflags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    minor=${k8s#v1.}
    minor=${minor%%.*}
    k8s_ldflags+=" -X $pkg.gitVersion=$k8s -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    k8s_ldflags+=" -X $pkg.gitTreeState=clean"
done

# The upstream build's tags (hack/lib/golang.sh): selinux,notest; static like upstream's
# control plane (the kubelet builds and runs fine static as well).
step "kubernetes $k8s" env CGO_ENABLED=0 go build -trimpath -tags selinux,notest \
    -ldflags "-s -w$k8s_ldflags" -o "$bin/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kubectl

step "etcd $(version_of go.etcd.io/etcd/server/v3)" env CGO_ENABLED=0 go build -trimpath \
    -ldflags "-s -w" -o "$bin/etcd" go.etcd.io/etcd/server/v3

# containerd's Makefile: urfave_cli_no_docs; no_btrfs drops the btrfs headers (no snapshotter
# here uses it). The shim is static (SHIM_CGO_ENABLED=0), as upstream ships it.
containerd_ldflags="-s -w -X github.com/containerd/containerd/v2/version.Version=$containerd"
step "containerd $containerd" env CGO_ENABLED=1 go build -trimpath \
    -tags "urfave_cli_no_docs no_btrfs" -ldflags "$containerd_ldflags" -o "$bin/" \
    github.com/containerd/containerd/v2/cmd/containerd github.com/containerd/containerd/v2/cmd/ctr
step "containerd-shim-runc-v2" env CGO_ENABLED=0 go build -trimpath \
    -tags "urfave_cli_no_docs no_btrfs" -ldflags "$containerd_ldflags -extldflags -static" \
    -o "$bin/containerd-shim-runc-v2" github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2

# runc: cgo (nsenter is C) with seccomp (libseccomp-dev); without libpathrs, which Debian does
# not package (runc then uses its Go implementation).
step "runc $runc" env -C "$(module_of runc)" CGO_ENABLED=1 go build -trimpath -buildmode=pie \
    -tags "seccomp urfave_cli_no_docs" -ldflags "-s -w -X main.version=${runc#v}" \
    -o "$bin/runc" github.com/opencontainers/runc

step "crictl $(version_of sigs.k8s.io/cri-tools crictl)" env -C "$(module_of crictl)" \
    CGO_ENABLED=0 go build -trimpath \
    -ldflags "-s -w" -o "$bin/crictl" sigs.k8s.io/cri-tools/cmd/crictl

step "cni plugins $(version_of github.com/containernetworking/plugins)" env CGO_ENABLED=0 \
    go build -trimpath -ldflags "-s -w" -o "$bin/cni/" \
    github.com/containernetworking/plugins/plugins/main/bridge \
    github.com/containernetworking/plugins/plugins/main/loopback \
    github.com/containernetworking/plugins/plugins/ipam/host-local \
    github.com/containernetworking/plugins/plugins/meta/portmap

pause_src=$(go list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause/linux/pause.c
step "pause" gcc -Os -Wall -Werror -static -DVERSION="$k8s-deviceplugin-e2e" \
    -o "$bin/pause" "$pause_src"

touch "$stamp"
log "built into $bin in $(( $(date +%s) - start )) s"
echo "$bin"
