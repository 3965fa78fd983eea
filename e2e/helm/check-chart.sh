#!/usr/bin/env bash
# `make lint`'s checks of the Helm chart: helm lint and helm template with the default values,
# with each file of the chart's ci/ folder and with the real cluster's values files, and every
# rendering validated by kubernetes-validate (strict) for Kubernetes 1.30 to 1.37; renderings
# with the DRA driver (resource.k8s.io/v1) from 1.34 on. A kind without a schema fails the check
# rather than passing unvalidated.
#
#   e2e/helm/check-chart.sh KUBERNETES_VALIDATE
#
# Helm comes from e2e/helm/build.sh (built once, cached). Renderings land in build/helm/.
set -euo pipefail

validate=$1
root=$(cd "$(dirname "$0")/../.." && pwd)
chart=$root/manifests/helm/deviceplugin
out=$root/build/helm
helm=$("$root/e2e/helm/build.sh")
all_versions=(1.30.0 1.31.0 1.32.0 1.33.0 1.34.0 1.35.0 1.36.0 1.37.0)
dra_versions=(1.34.0 1.35.0 1.36.0 1.37.0)

rm -rf "$out" && mkdir -p "$out"
status=0
check() {
    local name=$1 values=$2
    shift 2
    local versions=("$@") args=() flags=()
    [ -n "$values" ] && args=(--values "$values")
    "$helm" lint --strict --quiet "$chart" "${args[@]}" >/dev/null || {
        "$helm" lint --strict "$chart" "${args[@]}"
        status=1
        return
    }
    "$helm" template deviceplugin "$chart" --namespace gpu-operator "${args[@]}" >"$out/$name.yaml"
    for version in "${versions[@]}"; do flags+=(-k "$version"); done
    local report
    report=$("$validate" --strict --quiet "${flags[@]}" "$out/$name.yaml" 2>&1) || status=1
    if [ -n "$report" ]; then
        echo "$name: $report" >&2
        status=1
    fi
}

check defaults "" "${all_versions[@]}"
check simulated-node "$root/e2e/cluster/values-simulated-node.yaml" "${all_versions[@]}"
check mps "$root/e2e/cluster/values-mps.yaml" "${all_versions[@]}"
for values in "$chart"/ci/*-values.yaml; do
    name=$(basename "$values" -values.yaml)
    if grep -q '^dra:' "$values"; then
        check "$name" "$values" "${dra_versions[@]}"
    else
        check "$name" "$values" "${all_versions[@]}"
    fi
done
[ "$status" = 0 ] && echo "chart: lint, template and kubernetes-validate passed ($out)"
exit "$status"
