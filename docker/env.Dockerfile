# thicket env sidecar image: `thicket serve-env FAMILY --port P` for the in-process families
# (textcraft, the gymnasium toy-text envs). Built on the worker image; add env packages with
#   --build-arg ENV_PACKAGES="textworld ..."
ARG WORKER_IMAGE=ghcr.io/thicket/thicket:dev
FROM ${WORKER_IMAGE}
ARG ENV_PACKAGES=""
USER 0:0
RUN if [ -n "${ENV_PACKAGES}" ]; then pip install --no-cache-dir ${ENV_PACKAGES}; fi
USER 1000:1000
ENTRYPOINT ["thicket"]
CMD ["serve-env", "--help"]
