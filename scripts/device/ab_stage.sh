#!/bin/bash
# Stages a side-by-side decode A/B for one device call: two strata binaries (the one before a
# change and the one after) take turns over `strata bench decode`, then the given test binaries
# run (after the bench, so they do not disturb it). Usage:
#   scripts/device/ab_stage.sh BASE_STRATA NEW_STRATA [TEST_BINARY...]
# BASE_STRATA "-": no base binary; the new one runs against its own VARIANTS (an option that is
# off by default, timed on and off without carrying a second binary).
#   run(command="bash .devwork/ab/run.sh", carry=[".devwork/ab"])
# Knobs (environment, read when staging): ROUNDS (3), BATCHES (1,4,16,64), CONTEXT (1024),
# VARIANTS: extra runs of the new binary under environment switches or bench flags, e.g.
# "X=1 --fold-norms=0" (each word one variant: NAME=VALUE, or a --flag=value of bench decode);
# TEST_FILTER: a gtest filter for every test binary (e.g. "*FoldedNorms*:*Route*"; the whole
# engine test takes ~170 s on an H100). MIDS: more strata binaries (paths) that take their turn
# between base and new, each under its file name (e.g. the first of two stacked changes).
# NCU: a kernel-name regex; after the rounds, every binary's batch-1 step runs under Nsight
# Compute and the mean time of each matching kernel (per grid) is printed (ab_ncu.sh).
# NCU_FULL: REGEX:SKIP, the full section set for one launch of each binary, the one after SKIP
# matching launches, e.g. "MoeExperts:11" (the MoeExperts launches of a v2-lite step: 0-4 layer
# 0's q|kv_a, q.W_UK, o_proj, dense gate|up and down; 5-12 layer 1's q|kv_a, q.W_UK, o_proj,
# router logits, shared gate|up and down, routed gate|up and down; NCU's first= column gives
# these for any regex). Headline figures printed; the report and its per-instruction stall
# table in the logs.
# The new binary may have any name (it runs as ./strata). Output: one summary line per run
# (greedy: wall/GPU ms, the HBM-floor ratio, the host's enqueue and the work after the graph per
# batch), the tests' pass lines; logs come back as $OUT/ab.tgz.
set -euo pipefail
base=${1:?base strata}
new=${2:?new strata}
shift 2
here=$(cd "$(dirname "$0")" && pwd)
dest=.devwork/ab
rm -rf "$dest"
source "$here/bundle.sh"
bundle_binaries "$dest" "$new" "$@"
cp "$here/ab_ncu.sh" "$dest/"
# run.sh calls the new binary ./strata whatever its name here.
[ "$(basename "$new")" = strata ] || mv "$dest/$(basename "$new")" "$dest/strata"
runs="base new"
if [ "$base" = - ]; then
  runs=new
else
  cp "$base" "$dest/strata_base" && strip "$dest/strata_base"
fi
mids=""
for m in ${MIDS:-}; do
  name=$(basename "$m")
  case $name in strata|strata_base|base|new|*=*|--*) echo "MIDS: rename $m" >&2; exit 2 ;; esac
  cp "$m" "$dest/$name" && strip "$dest/$name"
  mids+=" $name"
done
[ "$base" = - ] || runs="base$mids new"
tests=""
for t in "$@"; do tests+=" $(basename "$t")"; done
cat > "$dest/run.sh" <<RUN
#!/bin/bash
cd "\$(dirname "\$0")"
source ./libpath.sh; source ./clocks.sh; stage_libpath strata --help > /dev/null || exit 3
pack() { (cd "\$OUT" && tar czf /tmp/ab.tgz . && find . -mindepth 1 -delete && mv /tmp/ab.tgz .); }
trap pack EXIT
# Per batch: greedy wall/GPU ms, the ratio, and the host's enqueue / the work after the graph
# (the bench's "host enqueue" and "to pinned" medians, ms).
summary() {
  awk '\$2=="greedy" {g=1; printf "b%s %s/%s r%s", \$1, \$3, \$4, \$9; next}
       g && /host enqueue/ {gsub(/,/, ""); printf " (h%s t%s)  ", \$3, \$7; g=0}' "\$1"
}
# The binary of a run: base, new (and its variants), or a MIDS binary by its name.
binary() { case \$1 in base) echo ./strata_base ;; new|--*|*=*) echo ./strata ;; *) echo "./\$1" ;; esac; }
for r in \$(seq ${ROUNDS:-3}); do
  for v in $runs ${VARIANTS:-}; do
    bin=\$(binary \$v); envs=""; flags=""
    case \$v in
      --*) flags=\$v ;;
      *=*) envs=\$v ;;
    esac
    log=\$OUT/dec_\${v//[^A-Za-z0-9_]/_}_\$r.log
    clocks_start \$OUT/clocks.csv
    env \$envs timeout 90 \$bin bench decode --batch ${BATCHES:-1,4,16,64} --context ${CONTEXT:-1024} \\
      --steps 20 \$flags > \$log 2>&1
    echo "\$v r\$r: \$(summary \$log)"
    clocks_stop
  done
done
$([ -z "${NCU:-}${NCU_FULL:-}" ] || cat <<NCU
source ./ab_ncu.sh
for v in $runs; do
  ${NCU:+ncu_times \$(binary \$v) '$NCU'}
  ${NCU_FULL:+ncu_full \$(binary \$v) '${NCU_FULL%:*}' ${NCU_FULL##*:}}
done
NCU
)
for t in$tests; do
  s=\$(date +%s); timeout 280 ./\$t ${TEST_FILTER:+--gtest_filter='$TEST_FILTER'} > \$OUT/\$t.log 2>&1
  echo "\$t rc=\$? \$(( \$(date +%s) - s )) s \$(grep -E '^\[  (PASSED|FAILED)' \$OUT/\$t.log | tr '\n' ' ')"
  grep -E "Failure|FAILED  \]" \$OUT/\$t.log | head -5
done
RUN
du -sb "$dest"
