#!/usr/bin/env bash
# Write the image's lock files (`make lock`), with uv from the dev venv:
#
#   requirements.lock              the operator's dependencies, pinned, with their hashes:
#                                  the image installs exactly these (--require-hashes)
#   hack/image/build-tools.lock    what the builder stage runs: setuptools and wheel (the
#                                  package's build backend), cyclonedx-bom (the SBOM)
#
# The first is resolved from pyproject.toml's dependencies less the `kubernetes` package,
# which the operator does not import in a cluster (tests/unit/test_image_lock.py checks
# both ways); the second from hack/image/build-tools.in. Run it after changing either.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
uv="${UV:-$repo/.venv/bin/uv}"
python="${PYTHON:-$repo/.venv/bin/python}"
cd "$repo"
compile=("$uv" pip compile --quiet --generate-hashes --universal --python-version 3.11
         --no-strip-markers --custom-compile-command "make lock")
"$python" hack/image/lock_input.py | "${compile[@]}" - -o requirements.lock
"${compile[@]}" hack/image/build-tools.in -o hack/image/build-tools.lock
