#!/usr/bin/env bash
# Interleaved A/B timing of two ffpa-bench binaries on the same points, for
# showing that a change kept each kernel instance's speed (run-to-run spread on
# the H200 is 5-10 %, so A and B alternate point by point, round by round,
# in one process tree, and the order flips every round).
#
#   scripts/ab_bench.sh A_BENCH B_BENCH OUT_JSONL ROUNDS [POINTS_FILE]
#
# POINTS_FILE: one set of ffpa-bench arguments a line (default: the points
# below, every compiled instance of both families). AB_BENCH_OPTS: the
# measurement options added to every point (default "--iters 10 --check-rows 4";
# longer runs, e.g. "--warmup 10 --iters 30 --check-rows 2", settle the power-
# limited instances). Summarize with
#   python3 scripts/ab_summary.py OUT_JSONL
set -uo pipefail
A=$1 B=$2 OUTFILE=$3 ROUNDS=${4:-3}
POINTS_FILE=${5:-}
OPTS=${AB_BENCH_OPTS:---iters 10 --check-rows 4}
if [ -n "$POINTS_FILE" ]; then
  mapfile -t POINTS <"$POINTS_FILE"
else
  POINTS=()
  for d in 256 320 384 512 640 768 1024; do POINTS+=("--impl sm90 --head-dim $d"); done
  POINTS+=("--impl sm90 --head-dim 512 --dtype f16"
           "--impl sm90 --head-dim 512 --causal top_left"
           "--impl sm90 --head-dim 512 --mask key-add"
           "--impl sm90 --head-dim 512 --dropout 0.1"
           "--impl sm90 --head-dim 1024 --causal bottom_right --mask key-bool")
  for d in 64 128 256 384 512 1024; do POINTS+=("--impl sm80 --head-dim $d --seq-q 4096"); done
  POINTS+=("--impl sm80 --head-dim 384 --seq-q 4096 --dtype f16 --accum f16"
           "--impl sm80 --head-dim 128 --seq-q 4096 --causal top_left --mask key-add --dropout 0.1")
fi
: >"$OUTFILE"
for ((round = 0; round < ROUNDS; ++round)); do
  for point in "${POINTS[@]}"; do
    if ((round % 2 == 0)); then order=(A B); else order=(B A); fi
    for side in "${order[@]}"; do
      bin=$A
      [ "$side" = B ] && bin=$B
      # shellcheck disable=SC2086  # the point and the options are word-split on purpose
      line=$("$bin" $point $OPTS --json 2>/dev/null | tail -n 1)
      printf '{"side": "%s", "round": %d, "point": "%s", "result": %s}\n' "$side" "$round" "$point" \
        "${line:-null}" >>"$OUTFILE"
    done
  done
  echo "ab_bench: round $((round + 1)) of $ROUNDS done"
done
