#!/usr/bin/env python3
"""Summary of scripts/ab_bench.sh output: per point, the median TFLOP/s of A
and B over the rounds, B / A, and whether both passed their checks.

    python3 scripts/ab_summary.py AB.jsonl [--markdown]
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    runs: dict[str, dict[str, list]] = defaultdict(lambda: {"A": [], "B": [], "kernel": {}, "passed": True})
    order: list[str] = []
    with open(sys.argv[1]) as f:
        for line in f:
            row = json.loads(line)
            point = row["point"]
            if point not in runs:
                order.append(point)
            result = row["result"]
            entry = runs[point]
            if result is None:
                entry["passed"] = False
                continue
            entry[row["side"]].append(result["tflops"]["median"])
            entry["kernel"][row["side"]] = result["kernel"]
            entry["passed"] &= bool(result["check"]["passed"]) if result.get("check") else True
    print("| point | kernel (B) | A TFLOP/s | B TFLOP/s | B / A | checks |")
    print("|---|---|---|---|---|---|")
    worst = None
    for point in order:
        entry = runs[point]
        if not entry["A"] or not entry["B"]:
            print(f"| {point} | - | - | - | - | a run failed |")
            continue
        a, b = statistics.median(entry["A"]), statistics.median(entry["B"])
        ratio = b / a
        worst = ratio if worst is None else min(worst, ratio)
        print(f"| `{point}` | {entry['kernel'].get('B', '?')} | {a:.1f} | {b:.1f} | {ratio:.3f} | "
              f"{'passed' if entry['passed'] else 'FAILED'} |")
    if worst is not None:
        print(f"\nworst B / A: {worst:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
