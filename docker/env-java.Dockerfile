# thicket env sidecar with Java 17, for ScienceWorld (its simulator runs on the JVM):
#   thicket serve-env scienceworld --port P
# Debian bookworm ships openjdk-17 (newer Debian releases do not), hence the pinned base.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
COPY . .
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
ARG VERSION=dev
ARG ENV_PACKAGES="scienceworld==1.2.3"
LABEL org.opencontainers.image.title="thicket-env-java" \
      org.opencontainers.image.description="thicket env sidecar with Java 17 (ScienceWorld)" \
      org.opencontainers.image.version="${VERSION}"
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 HOME=/tmp
RUN mkdir -p /usr/share/man/man1 \
 && apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
 && rm -rf /var/lib/apt/lists/* \
 && java -version
RUN groupadd --gid 1000 thicket \
 && useradd --uid 1000 --gid 1000 --home-dir /tmp --no-create-home --shell /usr/sbin/nologin thicket
COPY --from=wheel /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl ${ENV_PACKAGES} && rm -rf /wheels
USER 1000:1000
WORKDIR /tmp
ENTRYPOINT ["thicket"]
CMD ["serve-env", "--help"]
