#!/bin/bash
# Device run of the CUDA backend (see cuda_stage.sh). Everything under one overall deadline so
# that partial results still come back under $OUT:
#   STEPS="test bench hf"       which parts (default: all three)
#   HF_PRESETS=v3-shape-4l,v2-lite-shape  HF_LAYERS=0,0   (0: the preset's layers)
#   HF_ARGS=--fp32-ref
#   BENCH_ARGS="--batch 1,16,64 --context 1024 --steps 20"
cd "$(dirname "$0")"
start=$(date +%s)
source ./libpath.sh
stage_libpath strata --help || exit 3
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw,memory.used --format=csv
date -u; nproc; free -g | head -2; df -h /tmp | tail -1
steps=${STEPS:-test bench hf}
left() { echo $(( ${DEADLINE:-585} - ($(date +%s) - start) )); }
if [[ $steps == *test* ]]; then
  timeout $(( $(left) < 150 ? $(left) : 150 )) ./compute_nodes_cuda_engine_test 2>&1 | tee $OUT/test.log | grep -E "rows|OK|FAILED|Failure|error" | head -60
  echo "test rc=${PIPESTATUS[0]} at $(( $(date +%s) - start )) s"
fi
if [[ $steps == *bench* ]]; then
  timeout $(( $(left) < 200 ? $(left) : 200 )) ./strata bench decode --json $OUT/bench_decode.json ${BENCH_ARGS:---batch 1,16,64 --context 1024 --steps 20} 2>&1 | tee $OUT/bench.log
  echo "bench rc=${PIPESTATUS[0]} at $(( $(date +%s) - start )) s"
fi
if [[ $steps == *hf* ]]; then
  export PYTHONUNBUFFERED=1
  timeout $(( $(left) - 5 )) python3 hf_compare_cuda.py --strata $PWD/strata --work /tmp/hfcmp \
    --presets ${HF_PRESETS:-v3-shape-4l,v2-lite-shape} --num-layers ${HF_LAYERS:-0,0} \
    --json $OUT/hf_compare.json ${HF_ARGS:-} 2>&1 | grep -v Warning | tee $OUT/hf.log | tail -40
  echo "hf rc=${PIPESTATUS[0]} at $(( $(date +%s) - start )) s"
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
