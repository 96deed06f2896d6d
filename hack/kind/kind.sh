#!/usr/bin/env bash
# kind clusters for the e2e suite against the in-cluster operator (`make e2e-kind`).
#
#   hack/kind/kind.sh up NAME          create kind cluster NAME (kept if it exists)
#   hack/kind/kind.sh down NAME        delete it, its docker network, restore the host
#   hack/kind/kind.sh e2e NAME IMG     up, build IMG, load it, deploy the stand-in and
#                                      the operator (`helm install` of the chart), run
#                                      tests/e2e, down
#
# The kubeconfig of NAME is .local/kind/NAME/kubeconfig (never ~/.kube/config); kind is
# $KIND, else a kind on PATH, of KIND_VERSION, else built from its Go module into
# .local/bin; kubectl is the one on PATH, else hack/kube/bin/kubectl. Each cluster has
# its own docker network, kind-NAME.
#
# KIND_OFFLINE=1: no registry. The node image is built locally (hack/kind/offline/node.sh,
# cached by content) and the cluster runs with a static bridge CNI (single node); the
# operator image is built with `make docker-build OFFLINE=1`. Where `docker run
# --privileged` fails (a host without CAP_SYS_RESOURCE), hack/kind/offline/docker goes
# first on PATH for kind. Without it: kind's own node image, pulled as usual.
#
# The kubelet writes three host-wide sysctls (vm.overcommit_memory, kernel.panic,
# kernel.panic_on_oops). The first cluster records them (and whether /lib/modules,
# which docker creates for kind's mount, existed) in /tmp/himitsu-kind-host.state;
# the last one deleted restores them and removes that file and its lock. e2e deletes its cluster on any exit (KIND_KEEP=1
# keeps it). KIND_SKIP_IMAGE_BUILD=1 loads IMG as already built.
# Extra pytest arguments: PYTEST_ARGS="-k drift" hack/kind/kind.sh e2e NAME IMG.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
standin_ns=himitsu-standin
operator_ns=himitsu-system
helm_release=himitsu
: "${KIND_VERSION:=v0.33.0}"
: "${KIND:=$repo/.local/bin/kind}"
host_state=/tmp/himitsu-kind-host.state
host_lock=/tmp/himitsu-kind-host.lock
sysctls=(vm.overcommit_memory kernel.panic kernel.panic_on_oops)
export KIND_VERSION

usage() {
  sed -n '2,25p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

log() { echo "kind.sh: $*" >&2; }

need() {
  local tool
  for tool in "$@"; do
    command -v "$tool" >/dev/null 2>&1 || { log "'$tool' is not on PATH"; exit 1; }
  done
}

offline() { [[ "${KIND_OFFLINE:-0}" == "1" ]]; }

kubeconfig_of() { echo "$repo/.local/kind/$1/kubeconfig"; }

is_kind_version() { [[ -x "$1" ]] && [[ "$("$1" version 2>/dev/null)" == "kind $KIND_VERSION "* ]]; }

# $KIND if it is $KIND_VERSION, else a kind of that version on PATH, else built.
ensure_kind() {
  local on_path
  on_path="$(command -v kind || true)"
  if ! is_kind_version "$KIND" && [[ -n "$on_path" ]] && is_kind_version "$on_path"; then
    KIND="$on_path"
  fi
  if ! is_kind_version "$KIND"; then
    need go
    log "building kind $KIND_VERSION into $(dirname "$KIND")"
    mkdir -p "$(dirname "$KIND")"
    GOBIN="$(cd "$(dirname "$KIND")" && pwd)" go install "sigs.k8s.io/kind@$KIND_VERSION"
  fi
}

ensure_kubectl() {
  if [[ -z "${KUBECTL:-}" ]]; then
    KUBECTL="$(command -v kubectl || true)"
    [[ -n "$KUBECTL" ]] || { bash "$repo/hack/kube/build.sh" >&2; KUBECTL="$repo/hack/kube/bin/kubectl"; }
  fi
  export KUBECTL
}

cluster_exists() {
  "$KIND" get clusters 2>/dev/null | grep -qx "$1"
}

# Probe: can this host run a privileged container? kind passes --privileged to every
# node; on a host whose bounding set lacks a capability (these sandboxes have no
# CAP_SYS_RESOURCE) runc fails with "unable to apply caps: operation not permitted".
# Only then does the wrapper go first on PATH; a plain run must work, else docker
# itself is broken and the wrapper would not help.
# The wrapper stands in for exactly that case: the caps error, and CAP_SYS_RESOURCE (bit 24)
# the only capability missing from the bounding set (the dockerd started here shares it).
use_docker_wrapper_if_needed() {
  local image="$1" out bnd last missing
  if out="$(docker run --rm --privileged --entrypoint /bin/true "$image" 2>&1)"; then
    return 0
  fi
  docker run --rm --entrypoint /bin/true "$image" >/dev/null 2>&1 \
    || { log "docker cannot run $image at all: $out"; exit 1; }
  if ! grep -q 'unable to apply caps: operation not permitted' <<<"$out"; then
    log "docker run --privileged fails here, not for a missing capability (kind needs it):"
    log "$(head -n 3 <<<"$out")"
    exit 1
  fi
  bnd="${HIMITSU_KIND_CAPBND:-$(awk '/^CapBnd:/ {print $2}' /proc/self/status)}"  # override: tests
  last="$(cat /proc/sys/kernel/cap_last_cap)"
  missing=$(( ((1 << (last + 1)) - 1) & ~16#$bnd ))
  if (( missing != 1 << 24 )); then
    log "docker run --privileged fails here (unable to apply caps) and the capability bounding"
    log "set (CapBnd $bnd) lacks $(printf '%#x' "$missing"): hack/kind/offline/docker stands in"
    log "only for a missing CAP_SYS_RESOURCE (0x1000000); run kind where --privileged works"
    exit 1
  fi
  log "docker run --privileged fails here (no CAP_SYS_RESOURCE): kind runs through hack/kind/offline/docker"
  HIMITSU_KIND_REAL_DOCKER="$(command -v docker)"
  export HIMITSU_KIND_REAL_DOCKER
  PATH="$here/offline:$PATH"
}

# -- host state: sysctls the kubelet changes, /lib/modules docker creates -----------------
kind_nodes_on_host() {
  docker ps -aq --filter label=io.x-k8s.kind.cluster | grep -q .
}

# Holds the host lock for the rest of the (sub)shell: fd 9 on $host_lock, checked to be
# the file there now (the last restore removes it: a waiter on the removed one retries).
lock_host() {
  while :; do
    exec 9>>"$host_lock"
    flock 9
    [[ "$host_lock" -ef /dev/fd/9 ]] && return 0
    exec 9>&-
  done
}

record_host_state() {
  (
    lock_host
    if kind_nodes_on_host && [[ -f "$host_state" ]]; then
      exit 0  # another cluster recorded the host as it was before any
    fi
    kind_nodes_on_host && log "a kind cluster runs already: recording the host as it is now"
    {
      for s in "${sysctls[@]}"; do echo "sysctl $s $(sysctl -n "$s")"; done
      [[ -e /lib/modules ]] || echo "rmdir /lib/modules"
    } >"$host_state.new"
    mv "$host_state.new" "$host_state"
  )
}

restore_host_state() {
  (
    lock_host
    if [[ ! -f "$host_state" ]]; then
      kind_nodes_on_host || rm -f "$host_lock"
      exit 0
    fi
    if kind_nodes_on_host; then
      log "other kind clusters remain: the host's sysctls are restored by the last one"
      exit 0
    fi
    local what key value
    while read -r what key value; do
      case "$what" in
        sysctl)
          if [[ "$(sysctl -n "$key")" != "$value" ]]; then
            log "restoring $key = $value (was $(sysctl -n "$key"))"
            sysctl -q -w "$key=$value" || log "could not restore $key=$value (not root?)"
          fi ;;
        rmdir)
          rmdir "$key" 2>/dev/null || true ;;
      esac
    done <"$host_state"
    rm -f "$host_state" "$host_lock"
  )
}

# -- the cluster -------------------------------------------------------------------------------
cluster_config() {
  cat <<'EOF'
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
kubeadmConfigPatches:
  # Kubernetes 1.35+ kubelets refuse a cgroup v1 host unless told otherwise.
  - |
    kind: KubeletConfiguration
    failCgroupV1: false
EOF
  if offline; then
    cat <<'EOF'
networking:
  # No kindnetd (its image is on a registry): the node image has a static bridge CNI
  # config, which serves a single node.
  disableDefaultCNI: true
EOF
  fi
}

cmd_up() {
  local name="$1" kubeconfig image=() config
  need docker go
  ensure_kind
  kubeconfig="$(kubeconfig_of "$name")"
  local node_image
  if offline; then
    node_image="$(bash "$here/offline/node.sh")"
    image=(--image "$node_image")
  else
    node_image="$(kind_default_image)"
    docker image inspect "$node_image" >/dev/null 2>&1 || docker pull -q "$node_image" >/dev/null
  fi
  # Before anything that calls kind: `kind load` also runs `docker exec --privileged`.
  use_docker_wrapper_if_needed "$node_image"
  if cluster_exists "$name"; then
    log "kind cluster $name already exists (kubeconfig $kubeconfig)"
    return 0
  fi
  mkdir -p "$(dirname "$kubeconfig")"
  config="$(dirname "$kubeconfig")/cluster.yaml"
  cluster_config >"$config"
  record_host_state
  log "creating kind cluster $name (network kind-$name, kubeconfig $kubeconfig)"
  local start=$SECONDS
  KIND_EXPERIMENTAL_DOCKER_NETWORK="kind-$name" "$KIND" create cluster --name "$name" \
    "${image[@]}" --config "$config" --kubeconfig "$kubeconfig" --wait 180s
  log "cluster $name up in $((SECONDS - start)) s"
}

# The node image this kind defaults to (the one `kind create cluster` pulls): the constant
# compiled into the binary (any kind, built here or not, with or without a module cache).
kind_default_image() {
  local image
  image="$(grep -aoE -m1 'kindest/node:v[0-9.]+@sha256:[0-9a-f]{64}' "$KIND" | head -n 1 || true)"
  [[ -n "$image" ]] || { log "cannot tell which node image $KIND uses (no kindest/node:...@sha256 in it)"; exit 1; }
  echo "$image"
}

# Best effort, step by step: a failing `kind delete` or `docker network rm` (also from the
# EXIT trap, where `set -e` would otherwise abort it) never skips restore_host_state, always last.
cmd_down() {
  local name="$1" kubeconfig status=0
  (ensure_kind) || status=1
  kubeconfig="$(kubeconfig_of "$name")"
  if [[ -x "$KIND" ]] && cluster_exists "$name"; then
    "$KIND" delete cluster --name "$name" --kubeconfig "$kubeconfig" || { status=1; log "kind delete cluster $name failed"; }
  else
    log "no kind cluster $name"
  fi
  if docker network inspect "kind-$name" >/dev/null 2>&1; then
    docker network rm "kind-$name" >/dev/null || { status=1; log "docker network rm kind-$name failed"; }
  fi
  rm -rf "$(dirname "$kubeconfig")" || status=1
  restore_host_state || { status=1; log "could not restore the host state"; }
  return "$status"
}

# -- what runs in it ---------------------------------------------------------------------------
build_image() {
  local img="$1"
  if [[ "${KIND_SKIP_IMAGE_BUILD:-0}" == "1" ]]; then
    docker image inspect "$img" >/dev/null || { log "KIND_SKIP_IMAGE_BUILD=1 but no image $img"; exit 1; }
    return 0
  fi
  local offline_arg=()
  offline && offline_arg=(OFFLINE=1)
  make -C "$repo" --no-print-directory docker-build IMG="$img" "${offline_arg[@]}"
}

# The stand-in runs on the operator's image: it needs only Python's standard library.
deploy_standin() {
  local img="$1"
  "$KUBECTL" create namespace "$standin_ns" --dry-run=client -o yaml | "$KUBECTL" apply -f -
  "$KUBECTL" -n "$standin_ns" create configmap himitsu-standin-code \
    --from-file="$repo/hack/himitsu_standin" --dry-run=client -o yaml | "$KUBECTL" apply -f -
  sed "s|^\(\s*image:\) STANDIN-IMAGE$|\1 $img|" "$here/standin.yaml" | "$KUBECTL" apply -f -
  "$KUBECTL" -n "$standin_ns" rollout status deployment/himitsu-standin --timeout=180s
}

# The chart, as the README's first install path: `helm install` with hack/kind/values.yaml
# (the stand-in as the one allowed URL) and the image built here, into a namespace that
# enforces the restricted Pod Security Standard. tests/e2e/test_kind_helm.py upgrades,
# uninstalls and reinstalls this release ($E2E_HELM_RELEASE).
deploy_operator() {
  local img="$1" helm
  helm="$(bash "$repo/hack/helm.sh")"
  "$KUBECTL" create namespace "$operator_ns" --dry-run=client -o yaml | "$KUBECTL" apply -f -
  "$KUBECTL" label namespace "$operator_ns" --overwrite pod-security.kubernetes.io/enforce=restricted
  "$helm" upgrade --install "$helm_release" "$repo/charts/himitsu-controller" \
    --namespace "$operator_ns" -f "$here/values.yaml" \
    --set-string "image.repository=${img%:*}" --set-string "image.tag=${img##*:}" \
    --wait --timeout 240s
  "$KUBECTL" -n "$operator_ns" rollout status deployment/himitsu-operator --timeout=240s
  E2E_HELM="$helm"
  export E2E_HELM
}

# A Prometheus that finds the operator through what deploy/ ships (tests/e2e/test_prometheus.py).
deploy_prometheus() {
  local name="$1" kubeconfig="$2" img
  img="$(bash "$repo/hack/prometheus/prometheus.sh" image | tail -n 1)"
  "$KIND" load docker-image "$img" --name "$name"
  bash "$repo/hack/prometheus/prometheus.sh" deploy "$kubeconfig" "$img"
}

cmd_e2e() {
  local name="$1" img="$2" kubeconfig status=0
  need docker
  ensure_kubectl
  if [[ "${KIND_KEEP:-0}" != "1" ]]; then
    # shellcheck disable=SC2064 # expand now: the trap must delete this very cluster
    trap "set +e; cmd_down '$name' || true" EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
  fi
  local start=$SECONDS
  cmd_up "$name"
  kubeconfig="$(kubeconfig_of "$name")"
  export KUBECONFIG="$kubeconfig"

  log "== operator image $img"
  build_image "$img"
  log "== kind load docker-image $img"
  "$KIND" load docker-image "$img" --name "$name"
  log "== Himitsu stand-in"
  deploy_standin "$img"
  log "== operator (helm install)"
  deploy_operator "$img"
  log "== Prometheus (hack/prometheus)"
  deploy_prometheus "$name" "$kubeconfig"
  log "== e2e suite (ready after $((SECONDS - start)) s)"
  local python="$repo/.venv/bin/python"
  [[ -x "$python" ]] || python=python3
  # shellcheck disable=SC2086 # PYTEST_ARGS is a list of words on purpose
  E2E_KUBECONFIG="$kubeconfig" E2E_PROMETHEUS_NAMESPACE=himitsu-prometheus \
    E2E_HELM_RELEASE="$helm_release" \
    "$python" -m pytest "$repo/tests/e2e" \
    -m "e2e and not local_only" ${PYTEST_ARGS:-} || status=$?
  log "e2e-kind: pytest exit $status after $((SECONDS - start)) s"
  return "$status"
}

[[ $# -ge 1 ]] || usage
case "$1" in
  up) [[ $# -eq 2 ]] || usage; cmd_up "$2" ;;
  down) [[ $# -eq 2 ]] || usage; cmd_down "$2" ;;
  e2e) [[ $# -eq 3 ]] || usage; cmd_e2e "$2" "$3" ;;
  *) usage ;;
esac
