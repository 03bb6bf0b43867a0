# thicket's images, one target each (`make images` builds them all):
#   worker    the `thicket` CLI with the core dependencies: worker, aggregate, wait-job
#   env       + `thicket serve-env` and the Python env families (thicket[envs,alfworld]): the env sidecar
#   env-java  + Java 17 and ScienceWorld (thicket[sciworld]): the ScienceWorld sidecar
#   prefetch  huggingface_hub's `hf` alone: the prefetch Job (downloads a hub model into the cache)
# Python packages come from the lock files in requirements/ (exact versions), the base from an
# exact tag (override with --build-arg PYTHON_IMAGE=...). Compilers live in the build stages only;
# every final stage runs as the non-root uid 1000 with no build tools.
# Bookworm: it ships openjdk-17 (newer Debian releases do not).
ARG PYTHON_IMAGE=docker.io/library/python:3.11.14-slim-bookworm

# --- build stages: a venv at /opt/thicket, copied whole into a final stage ----------------------
# Dependencies first, thicket's own wheel last: a change to the source rebuilds only the last steps.
FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY jobs jobs
COPY storage storage
RUN pip wheel -q --no-cache-dir --no-deps --wheel-dir /wheels .

FROM ${PYTHON_IMAGE} AS deps
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
RUN python -m venv --without-pip /opt/thicket
COPY requirements/worker.txt /tmp/
RUN pip --python /opt/thicket/bin/python install -q --no-deps -r /tmp/worker.txt
# pyarrow's parts thicket never loads (Flight RPC, its own S3 client: thicket's is boto3; its tests
# and C++ headers): ~60 MB. The check imports what thicket uses.
RUN cd /opt/thicket/lib/python3.11/site-packages/pyarrow \
 && rm -rf tests include src includes *flight* _s3fs* libarrow_s3* *.pxd *.pyx \
 && cd / && /opt/thicket/bin/python -c "import pyarrow.parquet, pyarrow.compute, pyarrow.fs"

FROM deps AS env-deps
# jericho (under textworld) and fast-downward-textworld (ALFWorld's planner) build from source:
# make, cmake and the compilers, here only.
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends build-essential cmake >/dev/null \
 && rm -rf /var/lib/apt/lists/*
COPY requirements/env.txt /tmp/
RUN pip --python /opt/thicket/bin/python install -q --no-deps -r /tmp/env.txt

FROM env-deps AS env-java-deps
COPY requirements/env-java.txt /tmp/
RUN pip --python /opt/thicket/bin/python install -q --no-deps -r /tmp/env-java.txt

FROM deps AS build
COPY --from=wheel /wheels /wheels
RUN pip --python /opt/thicket/bin/python install -q --no-deps /wheels/*.whl && /opt/thicket/bin/thicket --version

FROM env-deps AS build-env
COPY --from=wheel /wheels /wheels
RUN pip --python /opt/thicket/bin/python install -q --no-deps /wheels/*.whl && /opt/thicket/bin/thicket serve-env --help >/dev/null

FROM env-java-deps AS build-env-java
COPY --from=wheel /wheels /wheels
RUN pip --python /opt/thicket/bin/python install -q --no-deps /wheels/*.whl && /opt/thicket/bin/thicket serve-env --help >/dev/null

# The prefetch Job's download client only: huggingface_hub's `hf` (requirements/prefetch.txt), ~60 MB
# next to the worker's, instead of the multi-GB vLLM CUDA image on a CPU node.
FROM ${PYTHON_IMAGE} AS prefetch-deps
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
RUN python -m venv --without-pip /opt/thicket
COPY requirements/prefetch.txt /tmp/
RUN pip --python /opt/thicket/bin/python install -q --no-deps -r /tmp/prefetch.txt \
 && /opt/thicket/bin/hf download --help >/dev/null

# --- final stages -------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime
ARG VERSION=dev
LABEL org.opencontainers.image.version="${VERSION}"
# Numeric uid 1000 (runAsNonRoot can verify it; the pods set runAsUser 1000 too), with a passwd
# entry for libraries that look the user up. HOME is /tmp: an emptyDir in the pod.
RUN groupadd --gid 1000 thicket \
 && useradd --uid 1000 --gid 1000 --home-dir /tmp --no-create-home --shell /usr/sbin/nologin thicket
ENV PATH=/opt/thicket/bin:${PATH} PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOME=/tmp
WORKDIR /tmp
ENTRYPOINT ["thicket"]
CMD ["--help"]

FROM runtime AS worker
LABEL org.opencontainers.image.title="thicket" \
      org.opencontainers.image.description="thicket worker: tree-search rollouts of LLM agents"
COPY --from=build /opt/thicket /opt/thicket
USER 1000:1000

FROM runtime AS env
LABEL org.opencontainers.image.title="thicket-env" \
      org.opencontainers.image.description="thicket env sidecar: thicket serve-env FAMILY"
COPY --from=build-env /opt/thicket /opt/thicket
USER 1000:1000
CMD ["serve-env", "--help"]

FROM runtime AS env-java
LABEL org.opencontainers.image.title="thicket-env-java" \
      org.opencontainers.image.description="thicket env sidecar with Java 17 (ScienceWorld)"
RUN mkdir -p /usr/share/man/man1 \
 && apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends openjdk-17-jre-headless >/dev/null \
 && rm -rf /var/lib/apt/lists/* \
 && java -version
COPY --from=build-env-java /opt/thicket /opt/thicket
USER 1000:1000
CMD ["serve-env", "--help"]

FROM runtime AS prefetch
LABEL org.opencontainers.image.title="thicket-prefetch" \
      org.opencontainers.image.description="thicket prefetch: hf download of a hub model into the model cache"
COPY --from=prefetch-deps /opt/thicket /opt/thicket
USER 1000:1000
ENTRYPOINT ["hf"]
CMD ["--help"]
