#!/usr/bin/env bash
# Build a local Python 3.11 base image for the Dockerfile's PYTHON_IMAGE, from Debian
# packages only (for hosts that reach a Debian mirror but no image registry):
#
#   hack/image/python-base.sh            prints the image reference on its last line
#
# Debian bookworm minbase + python3 (3.11) python3-venv python3-pip python-is-python3
# ca-certificates, made with mmdebstrap and `docker import`ed. The tag is derived from
# this file's content (the package list and every option are in it), so a second run
# finds the image and skips the build; edit this file and the tag changes.
# Needs: docker, mmdebstrap (root, or an unprivileged mode mmdebstrap supports).
set -euo pipefail

DOCKER="${DOCKER:-docker}"
repo_name="${PYTHON_BASE_REPO:-himitsu-local/python}"
suite=bookworm
packages=python3,python3-venv,python3-pip,python-is-python3,ca-certificates

self="${BASH_SOURCE[0]}"
digest="$(sha256sum "$self" | cut -c1-12)"
ref="$repo_name:3.11-$suite-$digest"

log() { echo "python-base: $*" >&2; }

if "$DOCKER" image inspect "$ref" >/dev/null 2>&1; then
  log "$ref exists (content-derived tag), not rebuilt"
  echo "$ref"
  exit 0
fi
command -v mmdebstrap >/dev/null 2>&1 || {
  log "mmdebstrap is not on PATH (Debian: apt-get install mmdebstrap); or pass PYTHON_IMAGE=<a Python 3.11 image>"
  exit 1
}

work="$(mktemp -d "${TMPDIR:-/tmp}/himitsu-python-base.XXXXXX")"
trap 'rm -rf "$work"' EXIT
log "building $ref with mmdebstrap ($suite minbase + $packages)"
start=$SECONDS
# No recommends (python3-pip would pull a compiler); no man pages, docs (copyright files
# kept) or locales; mmdebstrap removes the apt lists and package cache itself.
mmdebstrap --quiet --variant=minbase --include="$packages" \
  --aptopt='APT::Install-Recommends "false"' \
  --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --dpkgopt='path-exclude=/usr/share/info/*' \
  "$suite" "$work/rootfs.tar"
"$DOCKER" import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["python3"]' \
  --message "mmdebstrap $suite minbase + $packages (hack/image/python-base.sh)" \
  "$work/rootfs.tar" "$ref" >/dev/null
log "built $ref in $((SECONDS - start)) s"
echo "$ref"
