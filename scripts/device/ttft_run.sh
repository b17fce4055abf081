#!/bin/bash
# TTFT of one long prompt (N tokens, default 4096) on a cuda worker of a random PRESET model cut
# to LAYERS layers: cold, then from the worker's own pool (resident blocks), then on a second
# worker with resident blocks off, from a cache server on the same host (shm; read in place once
# the worker has registered the arena). Staged by ttft_stage.sh; results on stdout, logs in $OUT.
cd "$(dirname "$0")"
[ -f lib.txz ] || [ -f lib.tgz ] && { source ./libpath.sh; stage_libpath strata --help || exit 3; }
S=${STRATA:-./strata}; BACKEND=${BACKEND:-cuda}; PRESET=${PRESET:-v2-lite-shape}
LAYERS=${LAYERS:-4}
N=${N:-4096}; O=${OUT:-/tmp/ttft-out}; mkdir -p $O
date -u
m=/tmp/ttft-model; rm -rf $m
t0=$(date +%s)
if ! $S model make-random --preset $PRESET --num-layers $LAYERS --out $m > $O/make.log 2>&1; then
  echo "make-random failed"; tail $O/make.log; exit 1
fi
echo "model written in $(( $(date +%s) - t0 )) s: $(du -sh $m | cut -f1)"
d=/tmp/ttft-run; rm -rf $d; mkdir -p $d
$S cache --set cache.listen=127.0.0.1:0 --set cache.http_listen= \
  --set cache.transfer_listen=127.0.0.1:0 --set cache.shm_socket=$d/shm.sock \
  --set cache.data_dir=$d/cache --set cache.dram.capacity=4294967296 \
  --ready-file $d/cache.ready > $O/cache.log 2>&1 &
for i in $(seq 1 60); do [ -s $d/cache.ready ] && break; sleep 0.5; done
cport=$(sed -n 's/.*grpc=\([0-9]*\).*/\1/p' $d/cache.ready)
start_worker() {  # name resident
  $S worker --model $m --set worker.backend=$BACKEND --set worker.listen=127.0.0.1:0 \
    --set worker.http_listen=127.0.0.1:0 --set worker.cache_address=127.0.0.1:$cport \
    --set worker.resident_blocks=$2 --ready-file $d/$1.ready > $O/worker_$1.log 2>&1 &
  for i in $(seq 1 120); do [ -s $d/$1.ready ] && break; sleep 0.5; done
  sed -n 's/.*grpc=\([0-9]*\).*/\1/p' $d/$1.ready
}
pa=$(start_worker a true); pb=$(start_worker b false)
echo "cache $cport, worker a (resident) $pa, worker b (cache only) $pb"
ids=$(python3 -c "print(','.join(str((i * 7919) % 90000 + 100) for i in range($N)))")
warm=$(python3 -c "print(','.join(str((i * 104729) % 90000 + 100) for i in range(300)))")
gen() {  # label prompt port: prints the timing line, and flags tokens unlike the cold run's
  timeout 120 $S generate --model $m --prompt-ids $2 --max-tokens 4 --worker 127.0.0.1:$3 \
    > $O/gen_$1.txt 2>&1
  local same=""
  if [ $1 != cold ] && [ -f $O/gen_cold.txt ] &&
    ! cmp -s <(head -1 $O/gen_cold.txt) <(head -1 $O/gen_$1.txt); then
    same=" TOKENS DIFFER"
  fi
  echo "$(tail -1 $O/gen_$1.txt)$same"
}
# First requests (graphs, buffers) out of the way.
for p in $pa $pb; do gen warm$p $warm $p > /dev/null; done
echo "a cold:       $(gen cold $ids $pa)"
sleep 1.5  # the save reaches the cache server
for k in 1 2 3; do echo "a resident $k: $(gen resident$k $ids $pa)"; done
for k in 1 2 3 4; do echo "b cache $k:    $(gen cache$k $ids $pb)"; sleep 0.5; done
grep -hE "registered .* shared host memory" $O/worker_b.log | head -1
kill %1 %2 %3 2>/dev/null; wait 2>/dev/null
