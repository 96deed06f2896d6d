#!/usr/bin/env bash
# Run a command with a Docker engine, leaving the machine's Docker state as found.
#
#   hack/kind/with-docker.sh CMD [ARGS...]
#
# For CI (.ci/run): installs docker.io, buildah and mmdebstrap with apt when missing;
# uses the dockerd that answers, or starts one and, after CMD (also on failure or a
# signal), stops it by its PID, then removes what that dockerd left on the host: the
# docker0 bridge and its iptables rules (restored from a snapshot taken before it
# started). Images stay in /var/lib/docker: they are the offline kind path's cache.
set -euo pipefail

log() { echo "with-docker.sh: $*" >&2; }

missing=()
command -v docker >/dev/null || missing+=(docker.io)
command -v buildah >/dev/null || missing+=(buildah)
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
if [[ ${#missing[@]} -gt 0 ]]; then
  log "apt-get install ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

dockerd_pid=""
snapshot=""
had_docker0=1
stop_dockerd() {
  [[ -n "$dockerd_pid" ]] || return 0
  log "stopping the dockerd it started (PID $dockerd_pid)"
  kill -TERM "$dockerd_pid" 2>/dev/null || true
  local deadline=$((SECONDS + 60))
  while kill -0 "$dockerd_pid" 2>/dev/null; do
    if ((SECONDS >= deadline)); then kill -KILL "$dockerd_pid" 2>/dev/null || true; fi
    sleep 0.5
  done
  ((had_docker0)) || ip link delete docker0 2>/dev/null || true
  if [[ -n "$snapshot" ]]; then
    iptables-restore <"$snapshot/v4" || log "could not restore the iptables rules"
    ip6tables-restore <"$snapshot/v6" 2>/dev/null || true
    rm -rf "$snapshot"
  fi
  dockerd_pid=""
}

if ! docker info >/dev/null 2>&1; then
  command -v dockerd >/dev/null || { log "no dockerd to start"; exit 1; }
  snapshot="$(mktemp -d /tmp/with-docker.XXXXXX)"
  iptables-save >"$snapshot/v4"
  ip6tables-save >"$snapshot/v6" 2>/dev/null || true
  ip link show docker0 >/dev/null 2>&1 || had_docker0=0
  trap stop_dockerd EXIT
  trap 'exit 130' INT TERM
  dockerd >/tmp/with-docker.dockerd.log 2>&1 &
  dockerd_pid=$!
  log "started dockerd (PID $dockerd_pid, log /tmp/with-docker.dockerd.log)"
  deadline=$((SECONDS + 60))
  until docker info >/dev/null 2>&1; do
    kill -0 "$dockerd_pid" 2>/dev/null || { log "dockerd exited"; tail -20 /tmp/with-docker.dockerd.log >&2; exit 1; }
    ((SECONDS < deadline)) || { log "dockerd did not answer within 60 s"; exit 1; }
    sleep 0.5
  done
fi

"$@"
