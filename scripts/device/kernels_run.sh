#!/bin/bash
# Device run (see kernels_stage.sh): MLA decode gpu test twice + `strata bench kernels`, results
# under $OUT.
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD/lib
./strata --version || export LD_LIBRARY_PATH=$PWD/lib:$PWD/libcxx
./strata --version || exit 3
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
date -u
./kernels_mla_decode_params_test 2>&1 | tail -2
timeout 200 ./kernels_mla_decode_test --gtest_repeat=2 > $OUT/mla_decode_test.log 2>&1; echo "test rc=$?"
grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure|rel_err" $OUT/mla_decode_test.log | sort | uniq -c | sort -rn | head -70
timeout 200 ./strata bench kernels --json $OUT/bench_kernels.json --iters 30 2>&1 | tee $OUT/bench.log
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
