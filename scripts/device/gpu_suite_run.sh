#!/bin/bash
# Device run of gpu_suite_stage.sh: logs and JSON under $OUT, everything under one deadline.
cd "$(dirname "$0")"
start=$(date +%s)
left() { echo $(( ${DEADLINE:-560} - ($(date +%s) - start) )); }
# Seconds a step may take: its own cap N, or what is left of the deadline, at least 1 (a step
# past the deadline then times out at once, rc 124, instead of handing timeout a negative time).
upto() { local l; l=$(left); (( l < $1 )) || l=$1; echo $(( l > 1 ? l : 1 )); }
# Only 8 files come back from $OUT (the device tool's limit) and this run writes ~35: they go back
# as one archive, $OUT/suite.tgz, also when a TERM stops the run early.
pack() {
  trap - EXIT TERM
  (cd "$OUT" && tar czf /tmp/suite.tgz . && find . -mindepth 1 -delete && mv /tmp/suite.tgz .)
}
trap pack EXIT
trap 'pack; exit 143' TERM
source ./libpath.sh
source ./clocks.sh
stage_libpath strata --help || exit 3
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader; date -u

for t in ./kernels_*_test; do
  timeout 180 $t > $OUT/kernels.log.tmp 2>&1
  echo "$(basename $t) rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' $OUT/kernels.log.tmp | tr '\n' ' ')"
  cat $OUT/kernels.log.tmp >> $OUT/kernels_tests.log
done
rm -f $OUT/kernels.log.tmp

timeout 300 ./compute_nodes_cuda_engine_test > $OUT/cuda_engine_test.log 2>&1
echo "cuda_engine_test rc=$? at $(( $(date +%s) - start )) s"
grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]|Failure" $OUT/cuda_engine_test.log | head -20
timeout 60 ./compute_nodes_device_kv_pool_test > $OUT/device_kv_pool_test.log 2>&1
echo "device_kv_pool_test rc=$? at $(( $(date +%s) - start )) s"
grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]|Failure" $OUT/device_kv_pool_test.log | head -20

timeout 90 ./transfer_cuda_test > $OUT/transfer_cuda_test.log 2>&1
echo "transfer_cuda_test rc=$? at $(( $(date +%s) - start )) s"
grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED  \]|Failure" $OUT/transfer_cuda_test.log | head -20

timeout $(upto 120) ./strata bench transfer --transports cuda,shm \
  --json $OUT/bench_transfer.json > $OUT/bench_transfer.log 2>&1
echo "bench transfer rc=$? at $(( $(date +%s) - start )) s"
python3 -c "import json; d=json.load(open('$OUT/bench_transfer.json')); print(d['ratios']); print(d.get('baselines', {}).get('cuda_memcpy_pinned'))" 2>/dev/null \
  || tail -5 $OUT/bench_transfer.log

# Block payloads <-> KV pages: per page, batched, in the pool's pinned buffer, and loads through
# an in-process cache server (shm), side by side.
timeout 90 ./strata bench kv-pool --preset v2-lite-shape --pages 64 \
  --json $OUT/bench_kv_pool.json > $OUT/bench_kv_pool.log 2>&1
echo "bench kv-pool rc=$? at $(( $(date +%s) - start )) s"
grep -E "import|export|load" $OUT/bench_kv_pool.log
timeout 90 ./strata bench kv-pool --preset v2-lite-shape --pages 64 --codec fp8 \
  --json $OUT/bench_kv_pool_fp8.json > $OUT/bench_kv_pool_fp8.log 2>&1
echo "bench kv-pool --codec fp8 rc=$? at $(( $(date +%s) - start )) s"
grep -E "import|export|load" $OUT/bench_kv_pool_fp8.log
# The copy engine against the kernels over PCIe (zero copy), in turns, with more repeats.
timeout 60 ./strata bench kv-pool --preset v2-lite-shape --pages 64 --repeats 15 \
  --through-cache 0 --json $OUT/bench_kv_pool_turns.json > $OUT/bench_kv_pool_turns.log 2>&1
echo "bench kv-pool --repeats 15 rc=$? at $(( $(date +%s) - start )) s"
grep -E "pinned" $OUT/bench_kv_pool_turns.log

# A cuda worker daemon serving a generate call; its tokens against the cpu backend's.
m=/tmp/gpu-suite-model
./strata model make-random --preset small-v3 --out $m > $OUT/make_random.log 2>&1
ids=5,17,300,4000,12,99,1024,7,65,2048,31,8
./strata generate --model $m --prompt-ids $ids --max-tokens 16 --backend cpu > $OUT/gen_cpu.txt 2>&1
echo "generate cpu rc=$?"
./strata generate --model $m --prompt-ids $ids --max-tokens 16 --backend cuda > $OUT/gen_cuda.txt 2>&1
echo "generate cuda rc=$?"
rm -f /tmp/gpu-suite-ready
./strata worker --model $m --set worker.backend=cuda --set worker.listen=127.0.0.1:0 \
  --set worker.http_listen=127.0.0.1:0 --ready-file /tmp/gpu-suite-ready > $OUT/worker.log 2>&1 &
wpid=$!
for i in $(seq 1 60); do [ -s /tmp/gpu-suite-ready ] && break; sleep 1; done
cat /tmp/gpu-suite-ready 2>/dev/null; port=$(sed -n 's/.*grpc=\([0-9]*\).*/\1/p' /tmp/gpu-suite-ready 2>/dev/null)
if [ -n "$port" ]; then
  timeout 60 ./strata generate --model $m --prompt-ids $ids --max-tokens 16 --worker 127.0.0.1:$port > $OUT/gen_worker.txt 2>&1
  echo "generate via cuda worker rc=$?"
  # Sampled (the GPU sampling kernel picks every decode token), twice with one seed: equal.
  for k in 1 2; do
    timeout 60 ./strata generate --model $m --prompt-ids $ids --max-tokens 16 --temperature 0.8 \
      --top-p 0.9 --seed 3 --worker 127.0.0.1:$port > $OUT/gen_worker_sampled$k.txt 2>&1
    echo "sampled generate via cuda worker rc=$?"
  done
  # The token line only (the second line carries timings).
  [ "$(head -1 $OUT/gen_worker_sampled1.txt)" = "$(head -1 $OUT/gen_worker_sampled2.txt)" ] \
    && echo "sampled runs equal" || echo "sampled runs DIFFER"
  # Resident blocks: a 200-token prompt, then the same again (its 3 full blocks come from the
  # worker's own pool), then twice at once (both sequences share those pages in one batch).
  res=$(python3 -c "print(','.join(str((i * 53) % 7000 + 9) for i in range(200)))")
  for k in 1 2; do
    timeout 60 ./strata generate --model $m --prompt-ids $res --max-tokens 16 \
      --worker 127.0.0.1:$port > $OUT/gen_resident$k.txt 2>&1
  done
  timeout 60 ./strata generate --model $m --prompt-ids $res --max-tokens 16 \
    --worker 127.0.0.1:$port > $OUT/gen_resident3.txt 2>&1 &
  g3=$!
  timeout 60 ./strata generate --model $m --prompt-ids $res --max-tokens 16 \
    --worker 127.0.0.1:$port > $OUT/gen_resident4.txt 2>&1 &
  g4=$!
  wait $g3 $g4
  for k in 2 3 4; do
    [ "$(head -1 $OUT/gen_resident1.txt)" = "$(head -1 $OUT/gen_resident$k.txt)" ] \
      && echo "resident run $k equal" || echo "resident run $k DIFFERS"
  done
  # TTFT cold (run 1) and with the prefix in the worker's pool (run 2).
  for k in 1 2; do echo "resident run $k: $(tail -1 $OUT/gen_resident$k.txt | cut -c1-150)"; done
  hport=$(sed -n 's/.*http=\([0-9]*\).*/\1/p' /tmp/gpu-suite-ready 2>/dev/null)
  python3 -c "import urllib.request; print([l for l in urllib.request.urlopen('http://127.0.0.1:$hport/metrics').read().decode().splitlines() if 'source=\"resident\"' in l or l.startswith('strata_worker_resident_blocks')])" 2>&1
fi
kill $wpid 2>/dev/null; wait $wpid 2>/dev/null
# A cuda worker with a cache server on this host (shm): the same long prompt three times; the
# second request loads its full blocks from the cache (copied: the worker registers the server's
# arena with CUDA in the background from then on), the third reads them in place; both must give
# the first run's tokens, and the worker's in-place counter must have moved.
cdir=/tmp/gpu-suite-cache; rm -rf $cdir /tmp/gpu-suite-cache-ready /tmp/gpu-suite-ready2; mkdir -p $cdir
./strata cache --set cache.listen=127.0.0.1:0 --set cache.http_listen= \
  --set cache.transfer_listen=127.0.0.1:0 --set cache.shm_socket=$cdir/shm.sock \
  --set cache.data_dir=$cdir --set cache.dram.capacity=536870912 \
  --ready-file /tmp/gpu-suite-cache-ready > $OUT/cache.log 2>&1 &
cpid=$!
for i in $(seq 1 30); do [ -s /tmp/gpu-suite-cache-ready ] && break; sleep 0.5; done
cport=$(sed -n 's/.*grpc=\([0-9]*\).*/\1/p' /tmp/gpu-suite-cache-ready 2>/dev/null)
# (Resident blocks off: the repeats must come from the cache server, not the worker's own pool.)
./strata worker --model $m --set worker.backend=cuda --set worker.listen=127.0.0.1:0 \
  --set worker.http_listen=127.0.0.1:0 --set worker.cache_address=127.0.0.1:$cport \
  --set worker.resident_blocks=false \
  --ready-file /tmp/gpu-suite-ready2 > $OUT/worker_cache.log 2>&1 &
w2=$!
for i in $(seq 1 60); do [ -s /tmp/gpu-suite-ready2 ] && break; sleep 1; done
port2=$(sed -n 's/.*grpc=\([0-9]*\).*/\1/p' /tmp/gpu-suite-ready2 2>/dev/null)
long=$(python3 -c "print(','.join(str((i * 37) % 5000 + 5) for i in range(200)))")
for k in 1 2 3; do
  timeout 60 ./strata generate --model $m --prompt-ids $long --max-tokens 16 \
    --worker 127.0.0.1:$port2 > $OUT/gen_cached$k.txt 2>&1
  echo "generate via worker with a cache, run $k rc=$?: $(tail -1 $OUT/gen_cached$k.txt | cut -c1-90)"
  sleep 0.5  # the arena's registration (a few ms) before the next run
done
for k in 2 3; do
  [ "$(head -1 $OUT/gen_cached1.txt)" = "$(head -1 $OUT/gen_cached$k.txt)" ] \
    && echo "cached run $k equal" || echo "cached run $k DIFFERS"
done
hport2=$(sed -n 's/.*http=\([0-9]*\).*/\1/p' /tmp/gpu-suite-ready2 2>/dev/null)
python3 -c "import urllib.request; print([l for l in urllib.request.urlopen('http://127.0.0.1:$hport2/metrics').read().decode().splitlines() if l.startswith('strata_cache_client_in_place_blocks_total')])" 2>&1
grep -E "registered .* shared host memory|copying blocks instead" $OUT/worker_cache.log | head -2
kill $w2 $cpid 2>/dev/null; wait $w2 $cpid 2>/dev/null
for f in gen_cpu gen_cuda gen_worker gen_worker_sampled1; do echo "== $f"; tail -3 $OUT/$f.txt 2>/dev/null; done
# Then greedy steps beside a KV load of 64 blocks, zero copy and by the copy engine.
clocks_start $OUT/clocks_decode.csv
timeout $(upto 150) ./strata bench decode --json $OUT/bench_decode.json \
  --batch 1,16,64 --context 1024 --steps 20 --concurrent-loads 64 > $OUT/bench_decode.log 2>&1
echo "bench decode rc=$? at $(( $(date +%s) - start )) s"
grep -E "ratio|batch|logits|greedy|sampled|^ +[0-9]+ +[0-9.]+ +[0-9.]+ \(" $OUT/bench_decode.log |
  grep -v host | tail -14
clocks_stop
# Whole-model prefill MFU (v3-shape-4l, one 4K prompt) and the attention kernels against their
# targets (FlashMLA ratios, prefill MFU).
# The MoE layer through the grouped wgmma GEMMs (default), then through one cuBLAS GEMM pair per
# expert (the host path), side by side.
for g in 1 0; do
  timeout $(upto 100) ./strata bench prefill --preset v3-shape-4l \
    --prompt 4096 --batch 1 --repeats 5 --moe-grouped $g --json $OUT/bench_prefill_g$g.json \
    > $OUT/bench_prefill_g$g.log 2>&1
  echo "bench prefill (moe grouped $g) rc=$? at $(( $(date +%s) - start )) s"
  tail -1 $OUT/bench_prefill_g$g.log
done
# 20 calls per point: at h_q 128 a median of 10 moved by up to 15 % between runs on one H200
# (kernels/mla_decode/NOTES.md, session 36).
clocks_start $OUT/clocks_kernels.csv
timeout $(upto 150) ./strata bench kernels --only mla_decode,prefill \
  --iters 20 --json $OUT/bench_kernels.json > $OUT/bench_kernels.log 2>&1
echo "bench kernels rc=$? at $(( $(date +%s) - start )) s"
grep -E "^ *(16|64|128) +[0-9]+ +[0-9]+ " $OUT/bench_kernels.log | head -12 | cut -c1-62
grep -E "^v[23]" $OUT/bench_kernels.log | cut -c1-80; grep "flashmla_min" $OUT/bench_kernels.log
clocks_stop
# The MLA call of a few-row decode step (batch 1, the v2-lite and v3 head counts): every split
# count and kernel by name, no FlashMLA figure (docs/decode-notes.md, the ablation).
timeout $(upto 60) ./strata bench kernels --only mla_decode --mla-batch 1 \
  --mla-seqs 1024,4096 --mla-heads 16,128 --iters 20 > $OUT/bench_kernels_b1.log 2>&1
echo "bench kernels --mla-batch 1 rc=$? at $(( $(date +%s) - start )) s"
grep -E "^ *(16|128) +[0-9]+ +[0-9]+ " $OUT/bench_kernels_b1.log | head -4
# The token pickers (greedy, temperature / top-k / top-p) by batch, vocab and logit spread.
timeout $(upto 40) ./strata bench kernels --only sample --iters 20 \
  --json $OUT/bench_sample.json > $OUT/bench_sample.log 2>&1
echo "bench kernels --only sample rc=$? at $(( $(date +%s) - start )) s"
grep -E "^102400 " $OUT/bench_sample.log | head -6
# A grid barrier against the kernel boundary it would replace (docs/gpu-benchmarks.md).
timeout $(upto 20) ./strata bench kernels --only barrier --iters 20 \
  --json $OUT/bench_barrier.json > $OUT/bench_barrier.log 2>&1
echo "bench kernels --only barrier rc=$? at $(( $(date +%s) - start )) s"
cat $OUT/bench_barrier.log
echo "done at $(( $(date +%s) - start )) s"
