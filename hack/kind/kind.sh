#!/usr/bin/env bash
# kind helpers for users with Docker (the development and CI machines have none, so the
# default `make test` runs the same suite on a local control plane instead).
#
#   hack/kind/kind.sh up NAME          create kind cluster NAME (kept if it exists)
#   hack/kind/kind.sh down NAME        delete it
#   hack/kind/kind.sh e2e NAME IMG     build IMG, load it into NAME, deploy the stand-in and
#                                      the operator, run tests/e2e against them
#
# e2e: the operator runs in-cluster (deploy/ through hack/kind/overlay with IMG), the
# Himitsu stand-in runs as a Pod + Service (python:3.11-slim, code from a ConfigMap), and
# pytest runs here with E2E_KUBECONFIG set and `-m "e2e and not local_only"`; tests that
# need their own operator flags skip themselves (see tests/e2e/kind.py).
# Extra pytest arguments: PYTEST_ARGS="-k drift" hack/kind/kind.sh e2e NAME IMG.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
standin_ns=himitsu-standin
operator_ns=himitsu-system

usage() {
  sed -n '2,15p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

need() {
  local tool
  for tool in "$@"; do
    command -v "$tool" >/dev/null 2>&1 || { echo "kind.sh: '$tool' is not on PATH" >&2; exit 1; }
  done
}

cluster_exists() {
  kind get clusters 2>/dev/null | grep -qx "$1"
}

cmd_up() {
  local name="$1"
  need kind docker
  if cluster_exists "$name"; then
    echo "kind cluster $name already exists"
  else
    kind create cluster --name "$name" --wait 180s
  fi
}

cmd_down() {
  local name="$1"
  need kind
  if cluster_exists "$name"; then
    kind delete cluster --name "$name"
  else
    echo "no kind cluster $name"
  fi
}

# Split IMG into the kustomize images fields: name[:tag] or name@digest.
image_fields() {
  local img="$1" last="${1##*/}"
  if [[ "$img" == *@* ]]; then
    printf '    newName: %s\n    digest: "%s"\n' "${img%@*}" "${img#*@}"
  elif [[ "$last" == *:* ]]; then
    printf '    newName: %s\n    newTag: "%s"\n' "${img%:*}" "${img##*:}"
  else
    printf '    newName: %s\n    newTag: "latest"\n' "$img"
  fi
}

deploy_standin() {
  local kubectl=(kubectl --kubeconfig "$1")
  "${kubectl[@]}" create namespace "$standin_ns" --dry-run=client -o yaml | "${kubectl[@]}" apply -f -
  "${kubectl[@]}" -n "$standin_ns" create configmap himitsu-standin-code \
    --from-file="$repo/hack/himitsu_standin" --dry-run=client -o yaml | "${kubectl[@]}" apply -f -
  "${kubectl[@]}" apply -f "$here/standin.yaml"
  # New code in the ConfigMap needs a new Pod: the stand-in imports it once at start.
  "${kubectl[@]}" -n "$standin_ns" rollout restart deployment/himitsu-standin
  "${kubectl[@]}" -n "$standin_ns" rollout status deployment/himitsu-standin --timeout=180s
}

deploy_operator() {
  local kubeconfig="$1" img="$2" overlay
  overlay="$(mktemp -d "$here/.overlay.XXXXXX")"
  # shellcheck disable=SC2064 # expand now: the trap must remove this very directory
  trap "rm -rf '$overlay'" EXIT
  sed '/^    newName:/d; /^    newTag:/d' "$here/overlay/kustomization.yaml" >"$overlay/kustomization.yaml"
  image_fields "$img" >>"$overlay/kustomization.yaml"
  kubectl --kubeconfig "$kubeconfig" apply -k "$overlay"
  kubectl --kubeconfig "$kubeconfig" -n "$operator_ns" rollout restart deployment/himitsu-operator
  kubectl --kubeconfig "$kubeconfig" -n "$operator_ns" rollout status deployment/himitsu-operator \
    --timeout=240s
}

# A Prometheus that finds the operator through what deploy/ ships (tests/e2e/test_prometheus.py).
deploy_prometheus() {
  local name="$1" kubeconfig="$2" img
  img="$(bash "$repo/hack/prometheus/prometheus.sh" image | tail -n 1)"
  "${KIND:-kind}" load docker-image "$img" --name "$name"
  bash "$repo/hack/prometheus/prometheus.sh" deploy "$kubeconfig" "$img"
}

cmd_e2e() {
  local name="$1" img="$2" kubeconfig
  need kind docker kubectl
  cmd_up "$name"
  kubeconfig="$(mktemp)"
  kind get kubeconfig --name "$name" >"$kubeconfig"

  echo "== docker build $img"
  docker build -t "$img" "$repo"
  echo "== kind load docker-image $img"
  kind load docker-image "$img" --name "$name"
  echo "== Himitsu stand-in"
  deploy_standin "$kubeconfig"
  echo "== operator"
  deploy_operator "$kubeconfig" "$img"
  echo "== Prometheus (hack/prometheus)"
  deploy_prometheus "$name" "$kubeconfig"

  echo "== e2e suite"
  local python="$repo/.venv/bin/python"
  [[ -x "$python" ]] || python=python3
  # shellcheck disable=SC2086 # PYTEST_ARGS is a list of words on purpose
  E2E_KUBECONFIG="$kubeconfig" E2E_PROMETHEUS_NAMESPACE=himitsu-prometheus "$python" -m pytest "$repo/tests/e2e" \
    -m "e2e and not local_only" ${PYTEST_ARGS:-}
}

[[ $# -ge 1 ]] || usage
case "$1" in
  up) [[ $# -eq 2 ]] || usage; cmd_up "$2" ;;
  down) [[ $# -eq 2 ]] || usage; cmd_down "$2" ;;
  e2e) [[ $# -eq 3 ]] || usage; cmd_e2e "$2" "$3" ;;
  *) usage ;;
esac
