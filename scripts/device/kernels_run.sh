#!/bin/bash
# Device run (see kernels_stage.sh): every staged kernels test (gpu ones twice, fresh random inputs
# each time), then `strata bench kernels`; logs and JSON under $OUT (at most 8 files come back).
#   TESTS="kernels_prefill_attention_test ..."  only these tests (default: all staged)
#   BENCH_ONLY=mla_decode,prefill,kv_pages       bench groups (default: all; "none" skips)
#   BENCH_ITERS=30
cd "$(dirname "$0")"
source ./libpath.sh
source ./clocks.sh
probe=$(ls kernels_*_test | head -1)
stage_libpath "$probe" --gtest_list_tests || exit 3
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
date -u
tests=${TESTS:-$(ls kernels_*_test)}
: > $OUT/tests.log
for t in $tests; do
  repeat=2
  case $t in *params_test) repeat=1 ;; esac
  echo "=== $t" >> $OUT/tests.log
  timeout 240 ./$t --gtest_repeat=$repeat >> $OUT/tests.log 2>&1
  echo "$t rc=$?"
done
echo "--- failures / summary"
grep -E "^\[  (FAILED|SKIPPED) |Failure|error:" $OUT/tests.log | sort | uniq -c | head -40
grep -E "^\[  PASSED" $OUT/tests.log | sort | uniq -c
if [ "${BENCH_ONLY:-all}" != none ] && [ -x ./strata ]; then
  only=${BENCH_ONLY:-mla_decode,prefill,kv_pages}
  clocks_start $OUT/clocks.csv
  timeout 300 ./strata bench kernels --json $OUT/bench_kernels.json --iters ${BENCH_ITERS:-30} \
    --only $only 2>&1 | tee $OUT/bench.log
  clocks_stop
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
