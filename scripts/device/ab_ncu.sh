# Sourced by the run.sh that ab_stage.sh writes: Nsight Compute over one binary's batch-1 decode
# step (`strata bench decode --batch 1 --steps 1 --num-layers 4 --cuda-graphs 0`, kernels
# serialized, clocks not locked). Output goes to $OUT, a summary to stdout.

ab_ncu_bin() { command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1; }

# ncu_times BIN REGEX: the mean GPU time (ns) of every kernel matching REGEX, one line per
# kernel name and grid (the same kernel runs with several grids: the dense, shared and routed
# experts, for example), with the index of its first launch among the matching ones: the SKIP
# that makes ncu_full with the same regex profile that launch.
ncu_times() {
  local bin=$1 regex=$2 name=${1#./} csv
  csv=$OUT/ncu_times_$name.csv
  timeout 120 "$(ab_ncu_bin)" --clock-control none --csv -k "regex:$regex" \
    --metrics gpu__time_duration.sum "$bin" bench decode --batch 1 --steps 1 --num-layers 4 \
    --cuda-graphs 0 > "$csv" 2>&1
  echo "ncu times $name rc=$?"
  awk -F'","' '/gpu__time_duration/ {
      k = $5; sub(/\(.*/, "", k); sub(/^[^<]*::/, "", k); k = k " grid " $9; v = $NF; gsub(/[",]/, "", v)
      if (!(k in n)) first[k] = launches
      s[k] += v; n[k]++; launches++
    }
    END {
      for (k in s) printf "  %-60s n=%-3d first=%-3d %8.0f ns\n", k, n[k], first[k], s[k] / n[k]
    }' "$csv" | sort
}

# ncu_full BIN REGEX SKIP: the full section set for one launch (the one after SKIP launches that
# match REGEX): its headline figures and warp stalls to stdout, the report, its details page and
# its per-instruction SASS table (stall samples per instruction) to $OUT.
ncu_full() {
  local bin=$1 regex=$2 skip=$3 name=${1#./} ncu rep
  ncu=$(ab_ncu_bin)
  rep=$OUT/ncu_full_$name
  timeout 150 "$ncu" --clock-control none --set full --import-source no -k "regex:$regex" \
    --launch-skip "$skip" --launch-count 1 -f -o "$rep" "$bin" bench decode --batch 1 \
    --steps 1 --num-layers 4 --cuda-graphs 0 > "$rep.log" 2>&1
  echo "ncu full $name rc=$?"
  "$ncu" -i "$rep.ncu-rep" --page details > "$rep.details.txt" 2>&1
  grep -E "Context [0-9]|Grid Size|Duration|Registers Per|Achieved Occupancy|DRAM Throughput|\
L2 Hit Rate|Warp Cycles Per Issued|Issued Warp Per|No Eligible|Eligible Warps" \
    "$rep.details.txt" | sed -E 's/  +/ /g' | head -20
  timeout 60 "$ncu" -i "$rep.ncu-rep" --page source --csv --print-source sass \
    > "$rep.sass.csv" 2>&1
  local rc=$?
  echo "  per-instruction table: $(wc -l < "$rep.sass.csv") lines (rc=$rc)"
}
