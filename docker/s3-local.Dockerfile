# A local S3 for pod rehearsals (`thicket rehearse`, `make pod-demo`): moto's server, in memory.
# Not for production: no persistence, no authentication.
ARG PYTHON_IMAGE=docker.io/library/python:3.11.14-slim-bookworm
FROM ${PYTHON_IMAGE}
ARG VERSION=dev
LABEL org.opencontainers.image.title="thicket-s3-local" org.opencontainers.image.version="${VERSION}"
COPY requirements/s3-local.txt /tmp/
RUN pip install --no-cache-dir -q --no-deps -r /tmp/s3-local.txt && rm /tmp/s3-local.txt
USER 1000:1000
EXPOSE 5000
ENTRYPOINT ["moto_server", "--host", "0.0.0.0", "--port", "5000"]
