#!/usr/bin/env bash
# Prints the path of a helm of $HELM_VERSION: $HELM if it is one, else a helm of that
# version on PATH, else built from its Go module (helm.sh/helm/v3, the Go module proxy)
# into $HELM, cached there like kind (hack/kind/kind.sh). No downloaded binary.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
: "${HELM_VERSION:=v3.22.0}"
: "${HELM:=$repo/.local/bin/helm}"

# The module version compiled into the binary (a `go install` build has no ldflags, so
# `helm version` would not tell).
is_helm_version() {
  [[ -x "$1" ]] && go version -m "$1" 2>/dev/null \
    | awk '$1 == "mod" && $2 == "helm.sh/helm/v3" {print $3}' | grep -qx "$HELM_VERSION"
}

on_path="$(command -v helm || true)"
if ! is_helm_version "$HELM" && [[ -n "$on_path" ]] && is_helm_version "$on_path"; then
  HELM="$on_path"
fi
if ! is_helm_version "$HELM"; then
  command -v go >/dev/null || { echo "helm.sh: go is not on PATH (needed to build helm)" >&2; exit 1; }
  echo "helm.sh: building helm $HELM_VERSION into $(dirname "$HELM")" >&2
  mkdir -p "$(dirname "$HELM")"
  GOBIN="$(cd "$(dirname "$HELM")" && pwd)" go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  built="$(dirname "$HELM")/helm"
  [[ "$built" -ef "$HELM" ]] || mv "$built" "$HELM"
fi
echo "$HELM"
