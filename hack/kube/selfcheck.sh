#!/usr/bin/env bash
# Smoke-check the local control plane end to end, in its own work directory.
#
# Why: the e2e suite relies on more than a serving apiserver: the garbage
# collector (Owner-mode Secrets), namespace deletion, the `default`
# ServiceAccount, TokenRequest, and an apiserver that can be restarted on the
# same port and etcd. Each is checked here against the real processes, and
# `down` must leave none of them running.
#
# Usage: bash hack/kube/selfcheck.sh [workdir]   (default: a fresh temp dir)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
dir="${1:-$(mktemp -d /tmp/localcluster-selfcheck.XXXXXX)}"
lc=(python3 "$repo/hack/localcluster.py")
export KUBECONFIG="$dir/kubeconfig"
k() { "$dir/bin/kubectl" "$@"; }
step() { printf '== %s\n' "$*"; }

# wait_until <seconds> <description> <command...>: poll, never a fixed sleep.
wait_until() {
  local deadline=$((SECONDS + $1)) what="$2"; shift 2
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then echo "FAIL: timed out waiting for $what" >&2; return 1; fi
    sleep 0.2
  done
}
gone() { ! k get "$@" >/dev/null 2>&1; }

cleanup() { "${lc[@]}" down --dir "$dir" >/dev/null 2>&1 || true; }
trap cleanup EXIT

step "up (first start)"
"${lc[@]}" up --dir "$dir" --audit
step "up again is a no-op"
"${lc[@]}" up --dir "$dir"
"${lc[@]}" status --dir "$dir"

step "kubectl version / get ns"
k version
k get ns

step "namespace create + delete (namespace controller)"
k create namespace selfcheck
k create namespace doomed
k delete namespace doomed --wait=false
wait_until 60 "namespace doomed to be deleted" gone namespace doomed

step "garbage collection of an ownerReference dependent"
k -n selfcheck create configmap owner --from-literal=a=b
uid="$(k -n selfcheck get configmap owner -o jsonpath='{.metadata.uid}')"
k -n selfcheck apply -f - <<EOF
apiVersion: v1
kind: ConfigMap
metadata:
  name: dependent
  ownerReferences:
  - {apiVersion: v1, kind: ConfigMap, name: owner, uid: "$uid"}
data: {x: "1"}
EOF
k -n selfcheck delete configmap owner
wait_until 60 "the garbage collector to delete configmap dependent" \
  gone -n selfcheck configmap dependent
echo "dependent deleted by the garbage collector"

step "TokenRequest (kubectl create token)"
token="$(k create token default -n default --duration=10m)"
[[ "$token" == *.*.* ]] || { echo "FAIL: not a JWT" >&2; exit 1; }
echo "got a ${#token}-character token"
k --token="$token" auth whoami -o jsonpath='{.status.userInfo.username}{"\n"}'

step "audit log records users"
grep -q '"user":{"username":"himitsu-local-admin"' "$dir/logs/audit.log"
echo "audit log has $(wc -l <"$dir/logs/audit.log") events"

step "restart kube-apiserver alone (same port, same etcd)"
k -n selfcheck create configmap survivor --from-literal=a=b
"${lc[@]}" restart-apiserver --dir "$dir"
k -n selfcheck get configmap survivor -o name
k -n selfcheck create configmap owner2 --from-literal=a=b
uid="$(k -n selfcheck get configmap owner2 -o jsonpath='{.metadata.uid}')"
k -n selfcheck apply -f - <<EOF
apiVersion: v1
kind: ConfigMap
metadata:
  name: dependent2
  ownerReferences:
  - {apiVersion: v1, kind: ConfigMap, name: owner2, uid: "$uid"}
EOF
k -n selfcheck delete configmap owner2
wait_until 60 "the garbage collector (after the restart) to delete configmap dependent2" \
  gone -n selfcheck configmap dependent2
echo "garbage collector still works after the apiserver restart"

step "down leaves no process"
pids="$(python3 -c 'import json,sys; print(" ".join(str(p["pid"]) for p in json.load(open(sys.argv[1]))["processes"].values()))' "$dir/cluster.json")"
"${lc[@]}" down --dir "$dir"
for pid in $pids; do
  if kill -0 "$pid" 2>/dev/null && [[ "$(cut -d' ' -f3 "/proc/$pid/stat" 2>/dev/null)" != Z ]]; then
    echo "FAIL: pid $pid still running" >&2; exit 1
  fi
done
trap - EXIT
echo "OK: all checks passed (work dir $dir)"
