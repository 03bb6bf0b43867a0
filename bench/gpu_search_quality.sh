#!/usr/bin/env bash
# The search-quality bench on a lent GPU machine (../shared/gpu/README.md). Here: `bash
# ../shared/gpu/prepare_thicket.sh .thk` (then drop .thk/bench/.venv-trl if it was copied). There,
# after the vLLM chunks and `DRY=1 bash .vllmc/chunk03/gpu_final.sh`, carrying [.thk]:
#     bash .thk/bench/gpu_search_quality.sh                      # tasks 200-327, 64 calls a task
#     TASKS=200-231 BUDGET=256 bash .thk/bench/gpu_search_quality.sh
# It installs thicket's wheels and runs bench/search_quality.py, which serves the demo policy with
# vLLM on the GPU; the figures land in $OUT.
set -u
H=$(cd "$(dirname "$0")/.." && pwd)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site2 "$H"/whl/*.whl || exit 5
export PYTHONPATH=/tmp/site2:/tmp/site HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 \
  VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1 THICKET_VLLM_PYTHON=python3
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nproc
cd "$H" && timeout "${LIMIT:-500}" python3 bench/search_quality.py --tasks "${TASKS:-200-327}" --budget "${BUDGET:-64}" \
  --vllm-arg=--enforce-eager --vllm-arg=--no-enable-flashinfer-autotune ${ALGOS:+--algorithms $ALGOS} \
  --out "$OUT/search_quality.json" 2>&1 | tee "$OUT/search_quality.log"
echo "rc=${PIPESTATUS[0]}"
