#!/usr/bin/env python3
"""Sums an ncu source page by SASS opcode: stall samples, instructions and the
top stall reasons of each, as the engineering logs' profile tables.

    ncu --import R.ncu-rep --page source --csv --print-source sass > R.csv
    python3 scripts/ncu_opcode_table.py R.csv [--top 14]

The CSV is ncu's (a kernel-name line, then a header with "Source",
"Warp Stall Sampling (All Samples)", "Instructions Executed" and one
"stall_<reason>" column per reason). Prints a markdown table.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import defaultdict


def opcode(source: str) -> str:
    words = source.split()
    if not words:
        return "?"
    word = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
    return word.split(".")[0]


def read_source_page(path: str) -> list[dict[str, str]]:
    """The rows of an ncu source page CSV (the lines from its "Address" header on), one per SASS instruction."""
    with open(path, newline="") as f:
        lines = f.read().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"Address"'))
    return list(csv.DictReader(lines[start:]))


def number(text: str) -> float:
    """A counter of the page (thousands separators allowed; empty or not a number: 0)."""
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv")
    parser.add_argument("--top", type=int, default=14)
    args = parser.parse_args()
    rows = read_source_page(args.csv)
    stall_columns = [c for c in rows[0] if c.startswith("stall_") and "Not Issued" not in c]
    samples: dict[str, float] = defaultdict(float)
    instructions: dict[str, float] = defaultdict(float)
    stalls: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))

    for row in rows:
        op = opcode(row["Source"])
        samples[op] += number(row["Warp Stall Sampling (All Samples)"])
        instructions[op] += number(row["Instructions Executed"])
        for c in stall_columns:
            stalls[op][c[len("stall_"):]] += number(row[c])
    total = sum(samples.values()) or 1.0
    print(f"total samples {total:.0f}, warp instructions (M) {sum(instructions.values()) / 1e6:.1f}")
    print("| opcode | samples | share | instructions (M) | top stall reasons |")
    print("|---|---|---|---|---|")
    for op in sorted(samples, key=samples.get, reverse=True)[: args.top]:
        reasons = sorted(stalls[op].items(), key=lambda kv: kv[1], reverse=True)[:3]
        s = samples[op] or 1.0
        text = ", ".join(f"{name} {100 * v / s:.0f} %" for name, v in reasons)
        print(f"| {op} | {samples[op]:.0f} | {100 * samples[op] / total:.1f} % | {instructions[op] / 1e6:.0f} | {text} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
