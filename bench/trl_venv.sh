#!/usr/bin/env bash
# A venv of its own for TRL (bench/trl_dpo.py): TRL pins its own transformers, accelerate and
# datasets, which need not agree with .venv's or .venv-vllm's. torch is the CPU build: from a
# local wheel folder pip already knows (find-links) or from PyTorch's CPU index.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=bench/.venv-trl
TORCH_INDEX=${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3)}
test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "torch==2.13.0+cpu" 2>/dev/null \
  || "$VENV/bin/python" -m pip install -q --index-url "$TORCH_INDEX" "torch==2.13.0+cpu"
# Pinned to what the recorded figures (bench/results/data_value) were trained with.
"$VENV/bin/python" -m pip install -q "trl==1.16.0" "transformers==5.24.0" "accelerate==1.15.0" \
  "datasets==5.2.0" "tokenizers==0.23.3"
"$VENV/bin/python" -c "import trl, transformers, torch, datasets; print('trl', trl.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__, 'datasets', datasets.__version__)"
