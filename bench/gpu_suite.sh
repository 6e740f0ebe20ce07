#!/usr/bin/env bash
# The GPU suite in one device call (bench/README.md, "The GPU suite"): the GPU tests, the zoo
# models against eager and torch.compile, attention against SDPA, per-kernel modelled vs measured
# times and generated GEMMs against cuBLAS, and every kernel run alone and checked. Each step has
# its own time limit so that one slow step cannot take the others' time; results land in $OUT
# (at most 8 files come back).
#   bash bench/gpu_suite.sh                       # every step, on the device machine, repo root
#   STEPS="tests check sanitize" CHECK_MODELS=bert,llama bash bench/gpu_suite.sh   # sanitize: when check faulted
#   STEPS=attention ATTN_SHAPES=mcfuser bash bench/gpu_suite.sh      # MCFuser's S1-S9
#   STEPS=persistent bash bench/gpu_suite.sh      # persistent kernels call after call; CUDA graphs per size
#   STEPS=persistent PERSIST_TESTS="test_static_cache_decode_steps_as_one_persistent_kernel_equal_eager" bash bench/gpu_suite.sh
#   STEPS=kernels KERNEL_PARTS=gemms bash bench/gpu_suite.sh   # generated GEMMs against cuBLAS only
#   STEPS=decode bash bench/gpu_suite.sh          # a decode step: eager, inductor graphs, tilefuse, persistent
#   STEPS=stems bash bench/gpu_suite.sh           # ResNet-50's stem: NCHW gathers vs channels-last 16-byte copies
#   STEPS=chain_tiles bash bench/gpu_suite.sh     # the causal prefill's chain timed per tile (CHAIN_TILES, CHAIN_SHAPE, CHAIN_CAUSAL=0): the
#                                                 # tile planned before the SFU's exponential, the one planned after, two warp-specialized
#   STEPS=gemvs bash bench/gpu_suite.sh           # a decode step's one-row projections: the pipelined small-M path against cuBLAS
# Needs highspy and tilefuse's own wheel in .whl/ (bench/README.md says how; tilefuse's for its
# metadata: torch.compile finds backend="tilefuse" by its entry point); carry: [".whl"].
set -u
OUT=${OUT:-/tmp/gpu_suite}
STEPS=${STEPS:-tests check sanitize launch models attention kernels}
MODELS=${MODELS:-bert,gpt2,vit,resnet,llama}
CHECK_MODELS=${CHECK_MODELS:-bert,llama,resnet}   # bert before llama: the order of the one fault seen
mkdir -p "$OUT"
LOG=$OUT/suite.log
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
# the working tree before /tmp/site: the wheel's tilefuse is there for its entry point, not its code
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 TILEFUSE_CACHE_DIR=/tmp/tf_cache
step() {  # step SECONDS NAME COMMAND...
  local limit=$1 name=$2; shift 2
  echo "=== $name (limit ${limit}s): $*" | tee -a "$LOG"
  local t0=$SECONDS
  timeout -k 5 "$limit" "$@" 2>&1 | grep -v "CUDAEvent.h:" | tee -a "$LOG"
  LAST_RC=${PIPESTATUS[0]}
  echo "=== $name: exit $LAST_RC after $((SECONDS - t0)) s" | tee -a "$LOG"
}
{ date -u; git rev-parse HEAD 2>/dev/null; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"; } 2>&1 | tee -a "$LOG"
TGT=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | grep -qi h200 && echo h200 || echo h100)
for s in ${STEPS//,/ }; do case $s in   # (steps apart by spaces or commas)
  tests) step ${T_TESTS:-110} tests python3 -m pytest tests/test_gpu.py tests/test_library_kernels.py tests/test_measure_timers.py -m gpu -q -rs -p no:cacheprovider -n 6 ;;
  check) step ${T_CHECK:-90} check python3 bench/gpu_check.py --sample --models "$CHECK_MODELS" --out "$OUT/gpu_check.json"; CHECK_RC=$LAST_RC ;;
  sanitize) [ "${CHECK_RC:-3}" = 3 ] && PYTORCH_NO_CUDA_MEMORY_CACHING=1 step ${T_SANITIZE:-150} sanitize compute-sanitizer --tool memcheck --print-limit 4 python3 bench/gpu_check.py --sample --models "$CHECK_MODELS" ;;
  models) step ${T_MODELS:-200} gpu_models python3 bench/gpu_models.py --size small --models "$MODELS" ${MODEL_VARIANTS:+--variants "$MODEL_VARIANTS"} --budget-s $(( ${T_MODELS:-200} - 30 )) --out "$OUT/gpu_models_small.json" ;;
  attention) step ${T_ATTN:-80} attention python3 bench/attention.py --target $TGT --shapes ${ATTN_SHAPES:-llm} --variants eager,sdpa_flash,tilefuse,tilefuse_graph --budget-s $(( ${T_ATTN:-80} - 25 )) --json "$OUT/attention_gpu_$(echo "${ATTN_SHAPES:-llm}" | tr ',' '_').json" ;;   # (a comma in a name does not come back)
  kernels) step ${T_KERNELS:-120} gpu_kernels python3 bench/gpu_kernels.py --models "$MODELS" ${KERNEL_PARTS:+--parts "$KERNEL_PARTS"} --gemm-tiles ${GEMM_TILES:-4} --budget-s $(( ${T_KERNELS:-120} - 20 )) --out "$OUT/gpu_kernels.json" ;;
  chain_tiles) step ${T_CHAIN:-160} chain_tiles python3 bench/gpu_chain_tiles.py --shape ${CHAIN_SHAPE:-32,4096,4096,128} \
      $([ "${CHAIN_CAUSAL-1}" = 1 ] && echo --causal) --time --timeout 30 --out "$OUT/chain_tiles.json" \
      --tiles "${CHAIN_TILES:-128,128,128,128,8,3,tma;64,64,128,128,4,3,tma;128,64,128,128,4,3,tma,ws;128,128,128,128,4,2,tma,ws}" ;;
  gemvs) step ${T_GEMVS:-60} gemvs python3 bench/gpu_kernels.py --parts gemms --gemms gemv --gemm-tiles ${GEMM_TILES:-4} --budget-s $(( ${T_GEMVS:-60} - 15 )) --out "$OUT/gpu_gemvs.json" ;;
  stems) step ${T_STEMS:-60} stems python3 bench/gpu_kernels.py --parts stems --budget-s $(( ${T_STEMS:-60} - 15 )) --out "$OUT/gpu_stems.json" ;;
  launch) step ${T_LAUNCH:-60} launch python3 bench/launch_overhead.py --json "$OUT/launch_overhead.json" ;;
  persistent)   # each test in its own process and time limit: a hang or a failure names its test
    for t in ${PERSIST_TESTS:-"test_persistent_kernels_equal_eager_call_after_call[bert]" "test_persistent_kernels_equal_eager_call_after_call[llama]" \
             test_generation_with_cuda_graphs_replays_one_graph_per_size test_generation_with_cuda_graphs_and_a_static_cache_writes_it_in_place \
             test_static_cache_decode_steps_as_one_persistent_kernel_equal_eager}; do
      TILEFUSE_PERSISTENT_CALLS=${PERSISTENT_CALLS:-10000} step ${T_PERSIST:-60} "persistent $t" python3 -m pytest "tests/test_gpu.py::$t" -m gpu --runslow -q -rs --tb=short -p no:cacheprovider
    done ;;
  decode) step ${T_DECODE:-300} decode python3 bench/gpu_decode.py --layers ${DECODE_LAYERS:-2} --calls ${PERSISTENT_CALLS:-10000} --out "$OUT/gpu_decode.json" ;;
  *) echo "unknown step $s" | tee -a "$LOG" ;;
esac; done
nvidia-smi --query-gpu=clocks.sm,temperature.gpu --format=csv 2>&1 | tee -a "$LOG"
