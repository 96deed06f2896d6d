# himitsu-controller image.
#
#   make docker-build        (hack/image/build.sh: BuildKit or buildah, whichever works)
#
# The build context is the repository root (see .dockerignore for what is sent).
# Three stages:
#   builder   installs requirements.lock into a venv in /opt/venv, pip checking every hash
#             (--require-hashes), writes the SBOM of that venv (cyclonedx-py), then builds
#             and installs the package itself with --no-deps. Its tools (setuptools, wheel,
#             cyclonedx-bom) come from hack/image/build-tools.lock, hashes checked too.
#   runtime   the same Python base with what a running operator never needs taken out:
#             pip, setuptools and wheel, apt and dpkg, perl, every shell and every other
#             program in the bin directories but the Python interpreter; plus the venv.
#   final     FROM scratch, that tree copied in as one layer: no shell, no package manager,
#             no installer, only Python, its standard library and the locked packages.
# The image holds exactly the packages of requirements.lock and the operator; `kubernetes`
# is not among them (the operator does not import it in a cluster). `make lock` renews
# the lock files; tests/unit/test_image_lock.py and tests/e2e/test_image_contents.py
# check the lock, the image and the SBOM (/opt/venv/share/doc/himitsu-controller/sbom.cdx.json)
# agree.
#
# Runtime contract with deploy/manager/manager.yaml (tests/unit/test_deploy.py checks it
# statically; `make docker-smoke` runs the image under the Deployment's securityContext):
#   * runs as 65532:65532 (no passwd entry needed; nothing reads or writes $HOME);
#   * works on a read-only root filesystem: bytecode is compiled at build time and never
#     written at run time (PYTHONDONTWRITEBYTECODE=1); the only writable path the process
#     may use is /tmp (an emptyDir in the Deployment);
#   * ports 8080 (metrics) and 8081 (health probes), set by the Deployment's flags.
#
# The base: Debian bookworm's Python 3.11, pinned by digest for registry builds (renew it
# with `docker buildx imagetools inspect python:3.11-slim-bookworm`); `make docker-build
# OFFLINE=1` builds a local one from Debian packages instead (hack/image/python-base.sh).
# SOURCE_DATE_EPOCH (build.sh: the commit's time) makes pip, compileall and the SBOM
# reproducible (hash-based .pyc files, no build time recorded), and is the mtime of every
# file the build wrote (clamped with touch; directories the last RUN empties of programs
# keep the build's time) and, with buildah (--timestamp), the image's creation time.
# The optional build secret `ca-bundle` is a CA bundle for pip (a TLS-intercepting proxy);
# a secret mount lends it to one RUN without ever making it part of a layer.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:a36c24f9cbdf4fd0f52d67f0823eeac19c2028c637cecc392d97f980d4fec56b

FROM ${PYTHON_IMAGE} AS builder
ARG SOURCE_DATE_EPOCH
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# The dependencies first, in layers of their own, keyed on the lock files only. A venv
# without pip, filled by the tools venv's pip (--python). --only-binary: wheels only,
# nothing is compiled from a source distribution.
COPY hack/image/build-tools.lock requirements.lock ./
RUN --mount=type=secret,id=ca-bundle \
    if [ -s /run/secrets/ca-bundle ]; then export PIP_CERT=/run/secrets/ca-bundle; fi \
 && python -m venv /opt/tools \
 && /opt/tools/bin/pip install --require-hashes --no-deps --only-binary :all: -r build-tools.lock \
 && python -m venv --without-pip /opt/venv \
 && /opt/tools/bin/pip --python /opt/venv/bin/python install \
      --require-hashes --no-deps --only-binary :all: -r requirements.lock
# The SBOM: every package of the venv (so, of the lock), the operator as root component.
COPY pyproject.toml ./
RUN mkdir -p /opt/venv/share/doc/himitsu-controller \
 && /opt/tools/bin/cyclonedx-py environment --pyproject pyproject.toml --output-reproducible \
      -o /opt/venv/share/doc/himitsu-controller/sbom.cdx.json /opt/venv/bin/python
# pyproject.toml names README.md as the package readme, so the build needs it.
COPY README.md ./
COPY src/ src/
# The wheel is built with the locked setuptools (no build isolation: nothing is fetched)
# and installed with --no-deps; pip compiles the .pyc files now, not at run time.
# Then the SBOM's root component gets the version just built (pyproject's is dynamic, so
# cyclonedx-py could not know it), and every file the build wrote the time of the commit.
RUN /opt/tools/bin/pip wheel --no-deps --no-build-isolation --wheel-dir /tmp/wheel . \
 && /opt/tools/bin/pip --python /opt/venv/bin/python install --no-deps /tmp/wheel/*.whl \
 && /opt/venv/bin/python -c 'import importlib.metadata as m, json, sys; \
p = sys.argv[1]; sbom = json.load(open(p)); \
sbom["metadata"]["component"]["version"] = m.version("himitsu-controller"); \
open(p, "w").write(json.dumps(sbom, indent=2) + "\n")' \
      /opt/venv/share/doc/himitsu-controller/sbom.cdx.json \
 && if [ -n "${SOURCE_DATE_EPOCH:-}" ]; then \
      find /opt/venv -newermt "@$SOURCE_DATE_EPOCH" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +; \
    fi

FROM ${PYTHON_IMAGE} AS runtime
ARG SOURCE_DATE_EPOCH
ENV PYTHONDONTWRITEBYTECODE=1
# The base's own packages (pip, setuptools, wheel: the venv does not see them), the parts
# of the standard library no operator imports, apt, dpkg (its status file stays, for
# scanners), perl and documentation; the standard library is compiled (a no-op where the
# base ships .pyc files); last, every program but the interpreter, shells included.
RUN set -eu; \
    python="$(readlink -f "$(command -v python3)")"; \
    stdlib="$(python3 -c 'import sysconfig; print(sysconfig.get_path("stdlib"))')"; \
    for site in $(python3 -c 'import site; print(" ".join(site.getsitepackages()))'); do \
      rm -rf "$site"; \
    done; \
    rm -rf "$stdlib"/ensurepip "$stdlib"/idlelib "$stdlib"/tkinter "$stdlib"/turtledemo \
      "$stdlib"/lib2to3 "$stdlib"/test "$stdlib"/pydoc_data "$stdlib"/config-3.* \
      /etc/apt /etc/dpkg /var/lib/apt /var/cache/apt /var/cache/debconf /var/log/* \
      /usr/lib/apt /usr/lib/dpkg /usr/libexec/dpkg /usr/lib/*/libapt-* /usr/share/dpkg \
      /usr/share/debconf \
      /usr/share/perl* /usr/lib/*/perl* /usr/share/man /usr/share/info /usr/share/locale \
      /usr/share/lintian /usr/share/bash-completion /usr/share/bug /usr/share/menu \
      /etc/cron.daily /etc/logrotate.d /usr/local/include /usr/include; \
    find "$stdlib" -depth -type d \( -name test -o -name tests -o -name idle_test \) \
      -exec rm -rf {} +; \
    python3 -m compileall -q -j0 "$stdlib"; \
    if [ -n "${SOURCE_DATE_EPOCH:-}" ]; then \
      find / -xdev \( -path /proc -o -path /sys -o -path /dev -o -path /run/secrets \
        -o -path /etc/hosts -o -path /etc/hostname -o -path /etc/resolv.conf \) -prune \
        -o -newermt "@$SOURCE_DATE_EPOCH" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +; \
    fi; \
    find /usr/bin /usr/sbin /usr/local/bin /usr/local/sbin -mindepth 1 \
      ! -samefile "$python" ! \( -type l -name 'python*' ! -name '*-config' \) -delete
COPY --from=builder /opt/venv /opt/venv
# Exec form: there is no shell left. Proves the venv runs on what remains.
RUN ["/opt/venv/bin/himitsu-controller", "--help"]

FROM scratch
COPY --from=runtime / /
# MALLOC_ARENA_MAX: glibc's per-thread malloc arenas hold freed memory apart; two
# arenas cost the workers nothing under the GIL and 14 MiB less at 5,000 HimitsuSecrets
# (make bench-memory, whose operator gets the same setting).
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MALLOC_ARENA_MAX=2 \
    LANG=C.UTF-8 \
    PATH=/opt/venv/bin:/usr/local/bin:/usr/bin
# Last, so a new version or commit changes only the image config, not a layer.
ARG VERSION=unknown
ARG REVISION=unknown
LABEL org.opencontainers.image.title="himitsu-controller" \
      org.opencontainers.image.description="Kubernetes operator that syncs a Himitsu environment into a Secret" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
# Numeric, so the kubelet can check runAsNonRoot without a passwd entry.
USER 65532:65532
EXPOSE 8080 8081
ENTRYPOINT ["/opt/venv/bin/himitsu-controller"]
