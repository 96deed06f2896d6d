# himitsu-controller image.
#
#   make docker-build        (or, with BuildKit: docker build -t ghcr.io/himitsu-io/himitsu-controller:0.1.0 .)
#
# The build context is the repository root (see .dockerignore for what is sent).
# Two stages: the builder installs the package and its runtime dependencies into a venv
# in /opt/venv; the final image is the base plus that venv, so no build tooling, source
# tree or pip cache ends up in it.
#
# Runtime contract with deploy/manager/manager.yaml (tests/unit/test_deploy.py checks it
# statically; `make docker-smoke` runs the image under the Deployment's securityContext):
#   * runs as 65532:65532 (no passwd entry needed; nothing reads or writes $HOME);
#   * works on a read-only root filesystem: bytecode is compiled at install time and
#     never written at run time (PYTHONDONTWRITEBYTECODE=1); the only writable path the
#     process may use is /tmp (an emptyDir in the Deployment);
#   * ports 8080 (metrics) and 8081 (health probes), set by the Deployment's flags.
#
# RUN --mount needs BuildKit (the default builder since Docker 23; also podman/buildah):
# `make docker-build` picks what the host has (hack/image/build.sh). Where no registry is
# reachable, `make docker-build OFFLINE=1` builds a local Debian Python 3.11 base.
# The optional build secret `ca-bundle` is a CA bundle for pip (a TLS-intercepting proxy);
# a secret mount lends it to one RUN without ever making it part of a layer.

ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# The dependencies first, in a layer of their own: resolved again only when
# pyproject.toml changes, not on every source edit. A venv without pip, filled by the
# base image's pip (--python), so the venv holds no installer.
COPY pyproject.toml ./
RUN --mount=type=secret,id=ca-bundle \
    if [ -s /run/secrets/ca-bundle ]; then export PIP_CERT=/run/secrets/ca-bundle; fi \
 && python -m venv --without-pip /opt/venv \
 && python -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' >/tmp/requirements.txt \
 && pip --python /opt/venv/bin/python install -r /tmp/requirements.txt
# pyproject.toml names README.md as the package readme, so the build needs it.
COPY README.md ./
COPY src/ src/
# pip builds a wheel of the tree and installs it, compiling the .pyc files now, not at
# run time. --no-deps: the layer above has them (it is keyed on pyproject.toml).
RUN --mount=type=secret,id=ca-bundle \
    if [ -s /run/secrets/ca-bundle ]; then export PIP_CERT=/run/secrets/ca-bundle; fi \
 && pip --python /opt/venv/bin/python install --no-deps .

FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/venv/bin:$PATH
# Only the venv crosses over: no source tree, wheel, build tooling or pip cache. (A COPY,
# not a bind mount: buildah's layer cache keys a COPY on its content but reuses a RUN
# whose bind-mounted files changed.) The base's standard library is compiled too when it
# ships without .pyc files (a no-op when they are there), so nothing is compiled, nor
# written, at run time; the --help run proves the venv works on this base.
COPY --from=builder /opt/venv /opt/venv
RUN python -m compileall -q -j0 -x '/tests?/' \
    "$(python -c 'import sysconfig; print(sysconfig.get_path("stdlib"))')" \
 && /opt/venv/bin/himitsu-controller --help >/dev/null
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
