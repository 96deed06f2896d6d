#!/usr/bin/env bash
# Prometheus in a kind cluster for the e2e check (tests/e2e/test_prometheus.py; hack/kind/kind.sh
# calls this during `make e2e-kind`).
#
#   hack/prometheus/prometheus.sh image                   the image (built unless present); its
#                                                         name is the last line on stdout
#   hack/prometheus/prometheus.sh deploy KUBECONFIG IMG   prometheus.yaml + the ConfigMap from
#                                                         scrape_config.py; waits until Ready
#   hack/prometheus/prometheus.sh delete KUBECONFIG       remove both
#
# The image: with PROMETHEUS_IMAGE set (e.g. quay.io/prometheus/prometheus:v3.16.0 on a
# host that can pull), that one, pulled if absent. Unset: a FROM-scratch image holding
# only a static /bin/prometheus built from the Go module github.com/prometheus/prometheus
# at PROMETHEUS_MODULE (v0.316.0 = Prometheus 3.16.0) with Kubernetes service discovery
# only (build tags remove_all_sd,enable_kubernetes_sd): no registry, only the Go module
# proxy. (Debian's prometheus package is built without Kubernetes discovery.) The binary
# is cached in hack/prometheus/bin/, the image by its tag. KUBECTL: kubectl to use.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
module="${PROMETHEUS_MODULE:-v0.316.0}"
namespace=himitsu-prometheus

usage() {
  sed -n '2,18p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

cmd_image() {
  if [[ -n "${PROMETHEUS_IMAGE:-}" ]]; then
    docker image inspect "$PROMETHEUS_IMAGE" >/dev/null 2>&1 || docker pull "$PROMETHEUS_IMAGE" >&2
    echo "$PROMETHEUS_IMAGE"
    return
  fi
  local img="himitsu-e2e-prometheus:$module" bin="$here/bin/prometheus-$module"
  if docker image inspect "$img" >/dev/null 2>&1; then
    echo "$img"
    return
  fi
  if [[ ! -x "$bin" ]]; then
    command -v go >/dev/null || {
      echo "prometheus.sh: no Go to build Prometheus with; set PROMETHEUS_IMAGE to an image to pull" >&2
      exit 1
    }
    echo "== go install github.com/prometheus/prometheus/cmd/prometheus@$module (kubernetes SD only)" >&2
    local gobin dir version
    dir="$(cd "$here" && go mod download -json "github.com/prometheus/prometheus@$module" \
      | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
    version="$(cat "$dir/VERSION")"
    gobin="$(mktemp -d)"
    CGO_ENABLED=0 GOBIN="$gobin" go install -trimpath \
      -ldflags="-s -w -X github.com/prometheus/common/version.Version=$version" \
      -tags remove_all_sd,enable_kubernetes_sd \
      "github.com/prometheus/prometheus/cmd/prometheus@$module" >&2
    mkdir -p "$here/bin"
    mv "$gobin/prometheus" "$bin"
    rmdir "$gobin"
  fi
  echo "== docker import $img (FROM scratch: /bin/prometheus)" >&2
  local root
  root="$(mktemp -d)"
  install -D -m 0755 "$bin" "$root/bin/prometheus"
  mkdir -m 0777 "$root/prometheus"
  tar -C "$root" --owner=0 --group=0 -c . | docker import \
    --change 'ENTRYPOINT ["/bin/prometheus"]' --change 'USER 65534:65534' \
    --change 'WORKDIR /prometheus' \
    --change "LABEL io.himitsu.prometheus-module=$module" - "$img" >&2
  rm -rf "$root"
  echo "$img"
}

cmd_deploy() {
  local kubeconfig="$1" img="$2" python="$repo/.venv/bin/python"
  local kubectl=("${KUBECTL:-kubectl}" --kubeconfig "$kubeconfig")
  [[ -x "$python" ]] || python=python3
  sed "s|PROMETHEUS-IMAGE|$img|" "$here/prometheus.yaml" | "${kubectl[@]}" apply -f -
  "$python" "$here/scrape_config.py" --deploy "$repo/deploy" \
    | "${kubectl[@]}" -n "$namespace" create configmap prometheus-config \
        --from-file=prometheus.yml=/dev/stdin --dry-run=client -o yaml \
    | "${kubectl[@]}" apply -f -
  # Prometheus reads its config once at start: a new ConfigMap needs a new Pod.
  "${kubectl[@]}" -n "$namespace" rollout restart deployment/prometheus
  "${kubectl[@]}" -n "$namespace" rollout status deployment/prometheus --timeout=180s
}

cmd_delete() {
  local kubectl=("${KUBECTL:-kubectl}" --kubeconfig "$1")
  "${kubectl[@]}" delete --ignore-not-found namespace "$namespace"
  "${kubectl[@]}" delete --ignore-not-found clusterrolebinding/himitsu-e2e-prometheus \
    clusterrole/himitsu-e2e-prometheus
}

[[ $# -ge 1 ]] || usage
case "$1" in
  image) [[ $# -eq 1 ]] || usage; cmd_image ;;
  deploy) [[ $# -eq 3 ]] || usage; cmd_deploy "$2" "$3" ;;
  delete) [[ $# -eq 2 ]] || usage; cmd_delete "$2" ;;
  *) usage ;;
esac
