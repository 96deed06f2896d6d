#!/usr/bin/env bash
# Build a local Kubernetes control plane (etcd, kube-apiserver,
# kube-controller-manager, kubectl) from Go modules into hack/kube/bin/.
# `build.sh node` builds, in addition, what a kind node needs (kubelet, kubeadm,
# kube-proxy, kube-scheduler: hack/kind/offline/build.sh puts them in its images).
#
# Why: there is no Docker (so no kind) on the development and CI machines, yet
# the e2e suite and `make demo` need a real kube-apiserver with garbage
# collection and TokenRequest. The binaries are built from the same
# k8s.io/kubernetes version pinned in go.mod, and the build is skipped when
# every binary is newer than go.mod, go.sum, this script and the sources, so
# repeated runs cost nothing (the Go build cache covers partial rebuilds).
#
# Usage: build.sh [node]
# Environment: KUBE_BUILD_P (default 2) caps parallel compile jobs;
# KUBE_BUILD_FORCE=1 rebuilds even when the binaries look fresh; KUBE_BIN_DIR
# overrides the output directory.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
bin_dir="${KUBE_BIN_DIR:-$here/bin}"
binaries=(etcd kube-apiserver kube-controller-manager kubectl)
case "${1:-}" in
  "") ;;
  node) binaries+=(kubelet kubeadm kube-proxy kube-scheduler) ;;
  *) echo "usage: build.sh [node]" >&2; exit 2 ;;
esac

if ! command -v go >/dev/null 2>&1; then
  echo "build.sh: 'go' not found on PATH (Go >= 1.26 is required)" >&2
  exit 1
fi

# The version stamped into the binaries is the k8s.io/kubernetes requirement,
# so /version and kubectl's skew check agree with what was actually built.
version="$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v1\./ {print $2; exit}' go.mod)"
if [[ -z "$version" ]]; then
  echo "build.sh: cannot find the k8s.io/kubernetes version in go.mod" >&2
  exit 1
fi

is_fresh() {
  [[ "${KUBE_BUILD_FORCE:-0}" == "1" ]] && return 1
  local b newer
  for b in "${binaries[@]}"; do
    [[ -x "$bin_dir/$b" ]] || return 1
    newer="$(find go.mod go.sum build.sh "cmd/$b" -newer "$bin_dir/$b" -print -quit)"
    [[ -z "$newer" ]] || return 1
  done
  return 0
}

if is_fresh; then
  echo "build.sh: $version binaries in $bin_dir are up to date"
  exit 0
fi

major="${version#v}"; major="${major%%.*}"
minor="${version#v*.}"; minor="${minor%%.*}"
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
  ldflags+=" -X $pkg.gitTreeState=clean"
done

echo "build.sh: building Kubernetes $version (${binaries[*]}) ..."
start=$SECONDS
mkdir -p "$bin_dir"
CGO_ENABLED=0 go build -p "${KUBE_BUILD_P:-2}" -trimpath -buildvcs=false \
  -ldflags "$ldflags" -o "$bin_dir/" "${binaries[@]/#/./cmd/}"
# go build leaves an unchanged binary's mtime alone; touch so the freshness
# check above sees that this build covered the current sources.
for b in "${binaries[@]}"; do touch "$bin_dir/$b"; done
echo "build.sh: built in $((SECONDS - start))s into $bin_dir"
