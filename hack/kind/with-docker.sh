#!/usr/bin/env bash
# Run a command with a Docker engine, leaving the machine's Docker state as found.
#
#   hack/kind/with-docker.sh CMD [ARGS...]
#
# For CI (.ci/run): installs docker.io, buildah and mmdebstrap with apt when missing;
# uses the dockerd that answers, or starts one and, after CMD (also on failure or a
# signal), stops it by its PID, then removes what that dockerd left on the host: the
# docker0 bridge, its iptables rules and forwarding sysctls (reset, then restored
# from a snapshot taken before it started). Images stay in /var/lib/docker: they are
# the offline kind path's cache.
set -euo pipefail

log() { echo "with-docker.sh: $*" >&2; }

missing=()
# A client-only /usr/local/bin/docker is common: test for the daemon and its runtime.
for bin in dockerd containerd runc; do
  command -v "$bin" >/dev/null || { missing+=(docker.io); break; }
done
command -v buildah >/dev/null || missing+=(buildah)
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
if [[ ${#missing[@]} -gt 0 ]]; then
  log "apt-get install ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

dockerd_pid=""
containerd_pid=""
snapshot=""
had_docker0=1
sysctls=(net.ipv4.ip_forward net.ipv4.conf.all.forwarding net.bridge.bridge-nf-call-iptables net.bridge.bridge-nf-call-ip6tables)

# Save the rules and sysctls dockerd will change (into $snapshot).
save_host_net() {
  local key
  iptables-save >"$snapshot/v4"
  ip6tables-save >"$snapshot/v6" 2>/dev/null || true
  : >"$snapshot/sysctl"
  for key in "${sysctls[@]}"; do
    # absent now (br_netfilter not loaded): nothing to restore later
    sysctl -n "$key" >/dev/null 2>&1 && echo "$key $(sysctl -n "$key")" >>"$snapshot/sysctl"
  done
  return 0
}

# iptables-restore only replaces the tables its input names: an empty snapshot (a fresh
# host) would leave Docker's chains, MASQUERADE and FORWARD policy. So first reset every
# table present now (flush, delete chains, policies ACCEPT), then restore the snapshot.
reset_and_restore() {
  local save="$1" restore="$2" file="$3" table chain
  # only the tables that exist: `iptables-save -t T` would create T (nf_tables backend)
  for table in $("$save" 2>/dev/null | sed -n 's/^\*//p'); do
    "${restore%-restore}" -t "$table" -F
    "${restore%-restore}" -t "$table" -X
    for chain in $("$save" -t "$table" | sed -n 's/^:\([A-Z]*\) \([A-Z]*\) .*/\1/p'); do
      "${restore%-restore}" -t "$table" -P "$chain" ACCEPT
    done
  done
  "$restore" <"$file"
}

restore_host_net() {
  local key value
  reset_and_restore iptables-save iptables-restore "$snapshot/v4" || log "could not restore the iptables rules"
  [[ ! -s "$snapshot/v6" ]] || reset_and_restore ip6tables-save ip6tables-restore "$snapshot/v6" 2>/dev/null || true
  while read -r key value; do
    [[ "$(sysctl -n "$key" 2>/dev/null)" == "$value" ]] || sysctl -q -w "$key=$value" || log "could not restore $key=$value"
  done <"$snapshot/sysctl"
}

stop_pid() {
  local pid="$1" deadline=$((SECONDS + 60))
  kill -TERM "$pid" 2>/dev/null || return 0
  while kill -0 "$pid" 2>/dev/null; do
    if ((SECONDS >= deadline)); then kill -KILL "$pid" 2>/dev/null || true; fi
    sleep 0.5
  done
}

# Also from the EXIT trap: no `set -e` here; each step best effort, the host state last.
stop_dockerd() {
  set +e
  [[ -n "$dockerd_pid" ]] || return 0
  log "stopping the dockerd it started (PID $dockerd_pid)"
  containerd_pid="$(pgrep -P "$dockerd_pid" -x containerd 2>/dev/null | head -n 1)"
  stop_pid "$dockerd_pid"
  [[ -z "$containerd_pid" ]] || stop_pid "$containerd_pid"
  ((had_docker0)) || ip link delete docker0 2>/dev/null || true
  if [[ -n "$snapshot" ]]; then
    restore_host_net
    rm -rf "$snapshot"
  fi
  dockerd_pid=""
  return 0
}

if [[ "${WITH_DOCKER_SELFTEST:-}" == "net" ]]; then
  # hack/kind/test-with-docker.sh: the save/restore alone, in a throwaway `unshare -n` namespace
  snapshot="$(mktemp -d /tmp/with-docker.XXXXXX)"
  save_host_net
  "$@"
  restore_host_net
  rm -rf "$snapshot"
  exit 0
fi

if ! docker info >/dev/null 2>&1; then
  command -v dockerd >/dev/null || { log "no dockerd to start"; exit 1; }
  snapshot="$(mktemp -d /tmp/with-docker.XXXXXX)"
  save_host_net
  ip link show docker0 >/dev/null 2>&1 || had_docker0=0
  trap stop_dockerd EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  # its own session: a Ctrl-C or a group SIGTERM must not kill it while we still clean up
  # (no job control here, so setsid execs dockerd in place: $! is dockerd's PID)
  # its log is kept for a post-mortem, in the repo's .local (not /tmp)
  dockerd_log="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/.local/with-docker.dockerd.log"
  mkdir -p "$(dirname "$dockerd_log")"
  setsid dockerd >"$dockerd_log" 2>&1 </dev/null &
  dockerd_pid=$!
  log "started dockerd (PID $dockerd_pid, log $dockerd_log)"
  deadline=$((SECONDS + 60))
  until docker info >/dev/null 2>&1; do
    kill -0 "$dockerd_pid" 2>/dev/null || { log "dockerd exited"; tail -20 "$dockerd_log" >&2; exit 1; }
    ((SECONDS < deadline)) || { log "dockerd did not answer within 60 s"; exit 1; }
    sleep 0.5
  done
fi

"$@"
