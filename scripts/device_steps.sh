# The steps the device scripts under docs/perf share; sourced, not run:
#   B=<unpacked build folder>; RAW=<folder for logs and JSON> (default $OUT); . scripts/device_steps.sh
# Sets OUT (default /tmp/out) and log ($OUT/run.log), points the Python package at
# $B/libffpa.so, writes the GPU's name and clocks into the log (RAW=$OUT/raw: packs it into
# $OUT/raw.tgz at exit, one file for the device tool to return), and defines:
#   step TEXT                       a heading in the log
#   gtest LIMIT NAME CMD...         a test binary under a time limit; its output in
#                                   $RAW/NAME.log, its summary lines in the log
#   ab LIMIT LIB JSON ARGS...       bench/small_d_ab.py with LIB/libffpa.so (skipped
#                                   where LIB has none), its JSON in $RAW/JSON
#   interleave CASES NAME LIB...    each LIB twice, interleaved, on small_d_ab.py's
#                                   CASES (2 rounds of 10 calls); JSON NAME_<n>.json
OUT=${OUT:-/tmp/out}
RAW=${RAW:-$OUT}
mkdir -p "$OUT" "$RAW"
[ "$RAW" = "$OUT/raw" ] && trap 'tar -czf "$OUT/raw.tgz" -C "$OUT" raw && rm -rf "$RAW"' EXIT
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python:$PWD/bench FFPA_LIBRARY=$PWD/$B/libffpa.so
log=$OUT/run.log
step() { echo "== $1 ($(date +%T))" | tee -a "$log"; }
gtest() {
  local limit=$1 name=$2
  shift 2
  timeout "$limit" "$@" > "$RAW/$name.log" 2>&1
  echo "exit $?" | tee -a "$log"
  grep -E '^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED|ERROR SUMMARY' "$RAW/$name.log" | head -30 | tee -a "$log"
}
ab() {
  local limit=$1 lib=$2 json=$3
  shift 3
  [ -e "$lib/libffpa.so" ] || { echo "no $lib/libffpa.so: skipped" | tee -a "$log"; return; }
  FFPA_LIBRARY=$PWD/$lib/libffpa.so timeout "$limit" python3 bench/small_d_ab.py "$@" --json "$RAW/$json" 2>&1 |
    tee -a "$log"
}
interleave() {
  local cases=$1 name=$2
  shift 2
  local n=0
  for lib in "$@" "$@"; do
    n=$((n + 1))
    ab 40 "$lib" "${name}_$n.json" --rounds 2 --iters 10 --cases "$cases"
  done
}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv | tee -a "$log"
