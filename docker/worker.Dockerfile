# thicket worker image: the `thicket` CLI (worker, aggregate, wait-job, serve-env) as a non-root user.
#   make images        (tags it $(REGISTRY)/thicket:<version from pyproject.toml>)
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
COPY . .
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
ARG VERSION=dev
LABEL org.opencontainers.image.title="thicket" \
      org.opencontainers.image.description="thicket worker: tree-search rollouts of LLM agents" \
      org.opencontainers.image.version="${VERSION}"
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 HOME=/tmp
RUN groupadd --gid 1000 thicket \
 && useradd --uid 1000 --gid 1000 --home-dir /tmp --no-create-home --shell /usr/sbin/nologin thicket
COPY --from=wheel /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
# Numeric so that Kubernetes' runAsNonRoot can verify it; the pods set runAsUser 1000 too.
USER 1000:1000
WORKDIR /tmp
ENTRYPOINT ["thicket"]
CMD ["--help"]
