#!/usr/bin/env bash
# Build the operator image from the top-level Dockerfile with whatever this host has.
#
#   hack/image/build.sh IMG          (make docker-build [IMG=...] [OFFLINE=1])
#
# The Dockerfile uses RUN --mount, so it needs BuildKit or buildah. First that works:
#   1. docker buildx (any Docker with the buildx plugin; Docker 23+ builds with it);
#   2. a docker client older than 23 with its built-in BuildKit (DOCKER_BUILDKIT=1);
#      every `docker` on PATH is tried when DOCKER is not set;
#   3. buildah (`buildah bud --network host --isolation chroot`), then the image is
#      pushed into the Docker daemon (`buildah push IMG docker-daemon:IMG`) when there is
#      one, so `docker run` and `kind load docker-image` find it.
# Environment:
#   BUILDER=buildx|docker|buildah   skip the detection
#   DOCKER=/path/to/docker          the docker client to use (default: every one on PATH)
#   PYTHON_IMAGE=ref                the Python 3.11 base (default: the Dockerfile's, pinned
#                                   by digest)
#   OFFLINE=1                       no registry: build a local base with
#                                   hack/image/python-base.sh (mmdebstrap, cached)
#   CA_BUNDLE=/path/ca.pem          CA bundle for pip inside the build (default $PIP_CERT):
#                                   for a TLS-intercepting proxy; lent as a build secret,
#                                   so it never becomes part of a layer
#   SOURCE_DATE_EPOCH=seconds       recorded build time (default: the last commit's time)
#   BUILD_FLAGS="--no-cache ..."    more flags for the build command
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
img="${1:?usage: hack/image/build.sh IMG}"
builder="${BUILDER:-}"
ca_bundle="${CA_BUNDLE-${PIP_CERT-}}"

log() { echo "docker-build: $*" >&2; }
die() { log "$*"; exit 1; }

# -- which docker client, which builder ---------------------------------------------------------
docker_candidates() {
  if [[ -n "${DOCKER:-}" ]]; then echo "$DOCKER"; else type -ap docker || true; fi
}

# The first docker client that reaches a daemon, for inspect/push (any version will do).
docker_cli=""
for candidate in $(docker_candidates); do
  if "$candidate" version --format '{{.Server.Version}}' >/dev/null 2>&1; then
    docker_cli="$candidate"; break
  fi
done

client_major() { "$1" version --format '{{.Client.Version}}' 2>/dev/null | cut -d. -f1; }
server_version() { "$1" version --format '{{.Server.Version}}' 2>/dev/null; }

# Sets builder and build_cli: the first that works, or the first of kind $1 (BUILDER);
# explains each candidate it passes over.
detect() {
  local want="$1" candidate major server
  for candidate in $(docker_candidates); do
    server="$(server_version "$candidate")" || { log "$candidate: no Docker daemon answers"; continue; }
    if [[ "$want" == "" || "$want" == buildx ]] && "$candidate" buildx version >/dev/null 2>&1; then
      builder=buildx build_cli="$candidate"; return
    fi
    major="$(client_major "$candidate")"
    # Clients before 23 carry BuildKit themselves; daemons since 20.10 parse RUN --mount.
    if [[ "$want" == "" || "$want" == docker ]] && [[ "$major" =~ ^[0-9]+$ ]] \
        && (( major < 23 )) && [[ "${server%%.*}" -ge 20 ]]; then
      builder=docker build_cli="$candidate"; return
    fi
    [[ -n "$want" ]] || log "$candidate (client $major, daemon $server): no buildx plugin, and a client of 23+ has no built-in BuildKit"
  done
  if [[ "$want" == "" || "$want" == buildah ]] && command -v buildah >/dev/null 2>&1; then
    builder=buildah; return
  fi
  case "$want" in
    "") die "no builder for a Dockerfile with RUN --mount: install docker buildx, or buildah" ;;
    buildx) die "BUILDER=buildx: no docker on PATH has the buildx plugin (or DOCKER=...)" ;;
    docker) die "BUILDER=docker: no docker client before 23 (built-in BuildKit) reaches a daemon" ;;
    buildah) die "BUILDER=buildah: buildah is not on PATH" ;;
    *) die "BUILDER=$want: expected buildx, docker or buildah" ;;
  esac
}

builder_wanted="$builder"
builder=""
detect "$builder_wanted"

# -- the base image ------------------------------------------------------------------------------
python_image="${PYTHON_IMAGE:-}"
if [[ -z "$python_image" && "${OFFLINE:-}" == 1 ]]; then
  [[ -n "$docker_cli" ]] || die "OFFLINE=1 imports the local base into Docker: no Docker daemon answers"
  python_image="$(DOCKER="$docker_cli" bash "$here/python-base.sh" | tail -n1)"
fi
python_image="${python_image:-$(sed -n 's/^ARG PYTHON_IMAGE=//p' "$repo/Dockerfile")}"

version="$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$repo/src/himitsu_controller/__init__.py")"
revision="$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)"
source_date="${SOURCE_DATE_EPOCH:-$(git -C "$repo" log -1 --format=%ct 2>/dev/null || echo 0)}"
args=(--build-arg "VERSION=$version" --build-arg "REVISION=$revision"
      --build-arg "SOURCE_DATE_EPOCH=$source_date" -t "$img")
if [[ -n "$ca_bundle" ]]; then
  [[ -r "$ca_bundle" ]] || die "CA_BUNDLE=$ca_bundle is not readable"
  args+=(--secret "id=ca-bundle,src=$ca_bundle")
fi

read -ra extra <<<"${BUILD_FLAGS:-}"
args+=("${extra[@]}")
start=$SECONDS
case "$builder" in
  buildx)
    log "builder: docker buildx ($build_cli $(server_version "$build_cli")), base $python_image"
    "$build_cli" buildx build --load --build-arg "PYTHON_IMAGE=$python_image" "${args[@]}" "$repo"
    ;;
  docker)
    log "builder: docker BuildKit ($build_cli client $(client_major "$build_cli"), DOCKER_BUILDKIT=1), base $python_image"
    DOCKER_BUILDKIT=1 "$build_cli" build --build-arg "PYTHON_IMAGE=$python_image" "${args[@]}" "$repo"
    ;;
  buildah)
    # A base that is in the Docker daemon is taken from there, not from a registry.
    from="$python_image"
    if [[ -n "$docker_cli" ]] && "$docker_cli" image inspect "$python_image" >/dev/null 2>&1; then
      from="docker-daemon:$python_image"
    fi
    log "builder: buildah $(buildah --version | awk '{print $3}'), base $from"
    # --layers: reuse unchanged steps on the next build; --network host: the chroot
    # isolation has no network namespace of its own to set up.
    # --timestamp: the image's creation time and its files' mtimes are SOURCE_DATE_EPOCH.
    buildah bud --layers --network host --isolation chroot --timestamp "$source_date" \
      --build-arg "PYTHON_IMAGE=$from" "${args[@]}" "$repo"
    if [[ -n "$docker_cli" ]]; then
      buildah push --quiet "$img" "docker-daemon:$img"
      log "pushed $img into the Docker daemon"
    else
      log "no Docker daemon: $img is in buildah's storage only"
    fi
    ;;
esac
log "built $img in $((SECONDS - start)) s"
