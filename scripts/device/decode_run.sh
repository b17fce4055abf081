#!/bin/bash
# Device run of the decode step (see decode_stage.sh), under one overall deadline; logs and JSON
# under $OUT:
#   STEPS="ktest test bench ncu"  which parts (default: ktest test bench); ktest = the kernel test,
#                        test = compute_nodes_cuda_engine_test, ncu = per-kernel GPU times and DRAM
#                        bytes of one eager step (3 layers) at batch 1 and 64 under Nsight Compute
#   CONFIGS="base moe all"  bench variants: base = --cuda-graphs 0 --moe-device-max-tokens 0 (the
#                        backend before the device MoE path and graphs), moe = device MoE without
#                        graphs, all = both (default: all three)
#   BENCH_ARGS="--batch 1,16,64 --context 1024 --steps 20"
cd "$(dirname "$0")"
start=$(date +%s)
source ./libpath.sh
source ./clocks.sh
stage_libpath strata --help || exit 3
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw,memory.used --format=csv
date -u
left() { echo $(( ${DEADLINE:-570} - ($(date +%s) - start) )); }
steps=${STEPS:-ktest test bench}
if [[ $steps == *ktest* ]]; then
  timeout $(( $(left) < 120 ? $(left) : 120 )) ./kernels_moe_experts_test > $OUT/kernels.log 2>&1
  echo "kernels_moe_experts_test rc=$? at $(( $(date +%s) - start )) s"
  grep -E "tokens .*rel|FAILED|Failure|PASSED" $OUT/kernels.log | head -30
  : > $OUT/mla.log
  for t in kernels_mla_decode_test kernels_norm_act_test kernels_rope_test kernels_moe_router_test; do
    echo "=== $t" >> $OUT/mla.log
    timeout $(( $(left) < 150 ? $(left) : 150 )) ./$t >> $OUT/mla.log 2>&1
    echo "$t rc=$? at $(( $(date +%s) - start )) s"
  done
  grep -E "FAILED|Failure|PASSED" $OUT/mla.log | head -20
fi
if [[ " $steps " == *" test "* ]]; then
  timeout $(( $(left) < 240 ? $(left) : 240 )) ./compute_nodes_cuda_engine_test > $OUT/engine.log 2>&1
  echo "compute_nodes_cuda_engine_test rc=$? at $(( $(date +%s) - start )) s"
  grep -E "rows|FAILED|Failure|PASSED|error" $OUT/engine.log | head -60
fi
if [[ $steps == *bench* ]]; then
  for cfg in ${CONFIGS:-base moe all}; do
    case $cfg in
      base) flags="--cuda-graphs 0 --moe-device-max-tokens 0" ;;
      moe) flags="--cuda-graphs 0" ;;
      *) flags="" ;;
    esac
    echo "=== bench $cfg: $flags"
    clocks_start $OUT/clocks_$cfg.csv
    timeout $(( $(left) < 150 ? $(left) : 150 )) ./strata bench decode --json $OUT/bench_$cfg.json \
      ${BENCH_ARGS:---batch 1,16,64 --context 1024 --steps 20} $flags 2>&1 | tee $OUT/bench_$cfg.log
    echo "bench $cfg rc=${PIPESTATUS[0]} at $(( $(date +%s) - start )) s"
    clocks_stop
  done
fi
if [[ $steps == *ncu* ]]; then
  ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  for b in 1 64; do
    timeout $(( $(left) < 120 ? $(left) : 120 )) $ncu --clock-control none --csv \
      --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size \
      ./strata bench decode --batch $b --steps 1 --num-layers 3 --cuda-graphs 0 > $OUT/ncu_b$b.csv 2> $OUT/ncu_b$b.err
    echo "ncu b$b rc=$? at $(( $(date +%s) - start )) s"
  done
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
