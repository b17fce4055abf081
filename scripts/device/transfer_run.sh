#!/bin/bash
# Device run (see transfer_stage.sh): the cuda transport's gpu tests, then
# `strata bench transfer` with cuda (pinned cudaMemcpy H2D/D2H baselines, cuda_h2d_vs_memcpy_1MiB)
# plus shm and tcp; logs and JSON under $OUT.
cd "$(dirname "$0")"
source ./libpath.sh
stage_libpath transfer_cuda_test --gtest_list_tests || exit 3
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv
date -u
timeout 240 ./transfer_cuda_test --gtest_repeat=2 > $OUT/transfer_cuda_test.log 2>&1
echo "transfer_cuda_test rc=$?"
grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure" $OUT/transfer_cuda_test.log | sort | uniq -c
timeout 300 ./strata bench transfer --transports cuda,shm,tcp --json $OUT/bench_transfer.json \
  > $OUT/bench_transfer.log 2>&1
echo "bench rc=$?"
python3 -c "import json; d=json.load(open('$OUT/bench_transfer.json')); print(d['ratios']); print(d.get('best_gbps', {}).get('cuda')); print(d.get('cuda_skipped'))" 2>/dev/null \
  || tail -20 $OUT/bench_transfer.log
