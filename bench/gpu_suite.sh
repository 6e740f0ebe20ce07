#!/usr/bin/env bash
# The GPU suite in one device call (bench/README.md, "The GPU suite"): the GPU tests, the zoo
# models against eager and torch.compile, attention against SDPA, per-kernel modelled vs measured
# times and generated GEMMs against cuBLAS. Every step has its own time limit so that one slow
# step cannot take the others' time; results land in $OUT (at most 8 files come back).
#   bash bench/gpu_suite.sh            # on the device machine, from the repository root
# Needs highspy as a wheel in .whl/ (bench/README.md says how); carry: [".whl"].
set -u
OUT=${OUT:-/tmp/gpu_suite}
mkdir -p "$OUT"
LOG=$OUT/suite.log
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TILEFUSE_CACHE_DIR=/tmp/tf_cache
step() {  # step SECONDS NAME COMMAND...
  local limit=$1 name=$2; shift 2
  echo "=== $name (limit ${limit}s): $*" | tee -a "$LOG"
  local t0=$SECONDS
  timeout -k 5 "$limit" "$@" 2>&1 | tee -a "$LOG"
  echo "=== $name: exit ${PIPESTATUS[0]} after $((SECONDS - t0)) s" | tee -a "$LOG"
}
{ date -u; git rev-parse HEAD 2>/dev/null; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"; } 2>&1 | tee -a "$LOG"
TGT=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -qi h200 && echo h200 || echo h100)
step ${T_TESTS:-110} tests python3 -m pytest tests/test_gpu.py tests/test_library_kernels.py tests/test_measure_timers.py -m gpu -q -rs -p no:cacheprovider -n 4
step ${T_MODELS:-200} gpu_models python3 bench/gpu_models.py --size small --budget-s $(( ${T_MODELS:-200} - 30 )) --out "$OUT/gpu_models_small.json"
step ${T_ATTN:-80} attention python3 bench/attention.py --target $TGT --shapes llm --variants eager,sdpa_flash,tilefuse --budget-s $(( ${T_ATTN:-80} - 25 )) --json "$OUT/attention_gpu_llm.json"
step ${T_KERNELS:-120} gpu_kernels python3 bench/gpu_kernels.py --budget-s $(( ${T_KERNELS:-120} - 20 )) --out "$OUT/gpu_kernels.json"
nvidia-smi --query-gpu=clocks.sm,temperature.gpu --format=csv 2>&1 | tee -a "$LOG"
