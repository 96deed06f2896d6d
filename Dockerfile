# himitsu-controller image.
#
#   docker build -t ghcr.io/himitsu-io/himitsu-controller:0.1.0 .
#
# The build context is the repository root (see .dockerignore for what is sent).
# Two stages: the builder turns the source tree into a wheel; the final image installs
# only that wheel and its runtime dependencies into /opt/venv, so no build tooling,
# source tree or pip cache ends up in it.
#
# Runtime contract with deploy/manager/manager.yaml (tests/unit/test_deploy.py checks it):
#   * runs as 65532:65532 (no passwd entry needed; nothing reads or writes $HOME);
#   * works on a read-only root filesystem: bytecode is compiled at install time and
#     never written at run time (PYTHONDONTWRITEBYTECODE=1); the only writable path the
#     process may use is /tmp (an emptyDir in the Deployment);
#   * ports 8080 (metrics) and 8081 (health probes), set by the Deployment's flags.
#
# RUN --mount needs BuildKit (the default builder since Docker 23; also podman/buildah).

ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# pyproject.toml names README.md as the package readme, so the build needs it.
COPY pyproject.toml README.md ./
COPY src/ src/
RUN pip wheel --no-deps --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH
# A venv without pip, filled by the base image's pip (--python): the runtime image has
# no installer in its venv. The wheel is bind-mounted from the builder, so it never
# becomes a layer of this image. pip compiles .pyc files here, at install time.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    python -m venv --without-pip /opt/venv \
 && pip --python /opt/venv/bin/python install --no-cache-dir /wheels/*.whl \
 && /opt/venv/bin/himitsu-controller --help >/dev/null
LABEL org.opencontainers.image.title="himitsu-controller" \
      org.opencontainers.image.description="Kubernetes operator that syncs a Himitsu environment into a Secret" \
      org.opencontainers.image.licenses="Apache-2.0"
USER 65532:65532
EXPOSE 8080 8081
ENTRYPOINT ["/opt/venv/bin/himitsu-controller"]
