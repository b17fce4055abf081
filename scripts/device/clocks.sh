# Sourced by the device run scripts (bundle_binaries stages it next to them): samples the GPU's
# SM clock, power and clock-limit reasons every 200 ms while timed work runs, so that a figure
# can be told apart from the machine it ran on (a compute-bound kernel runs as fast as the SM
# clock; session 36's H200 ran the h_q 128 MLA call 2-7 % slower than an H100 did).
#   clocks_start FILE   start sampling into FILE (CSV); nothing happens without nvidia-smi
#   clocks_stop         stop, and print one line: SM MHz min / median / max, the most power
#                       drawn, and every clock-limit reason seen (nvidia-smi's bit mask)
clocks_start() {
  CLOCKS_FILE=$1
  CLOCKS_PID=
  : > "$CLOCKS_FILE"
  command -v nvidia-smi > /dev/null || return 0
  # Newer drivers name the reasons clocks_event_reasons; older ones clocks_throttle_reasons.
  # Asked once per run script, not before every timed run.
  if [ -z "$CLOCKS_FIELDS" ]; then
    CLOCKS_FIELDS=clocks.sm,power.draw
    local r  # the callers' round counters are often named r too
    for r in clocks_event_reasons.active clocks_throttle_reasons.active; do
      if nvidia-smi --query-gpu=$r --format=csv,noheader > /dev/null 2>&1; then
        CLOCKS_FIELDS=$CLOCKS_FIELDS,$r
        break
      fi
    done
  fi
  nvidia-smi --query-gpu=$CLOCKS_FIELDS --format=csv,noheader,nounits -lms 200 \
    >> "$CLOCKS_FILE" 2> /dev/null &
  CLOCKS_PID=$!
}

clocks_stop() {
  [ -n "$CLOCKS_PID" ] && kill "$CLOCKS_PID" 2> /dev/null && wait "$CLOCKS_PID" 2> /dev/null
  CLOCKS_PID=
  clocks_summary "$CLOCKS_FILE"
}

# One line for a CSV of "sm MHz, power W[, reasons]" samples.
clocks_summary() {
  sort -t, -k1,1n "$1" | awk -F', *' '
    $1 ~ /^[0-9]+$/ { sm[n++] = $1; if ($2 + 0 > watts) watts = $2 + 0;
                      if (NF > 2 && !($3 in seen)) { seen[$3] = 1; reasons = reasons " " $3 } }
    END {
      if (n == 0) { print "clocks: no samples (no nvidia-smi?)"; exit }
      printf "clocks: SM %d / %d / %d MHz (min / median / max of %d samples), power up to %.0f W",
             sm[0], sm[int(n / 2)], sm[n - 1], n, watts
      if (reasons != "") printf ", clock-limit reasons seen:%s", reasons
      printf "\n"
    }'
}
