#!/usr/bin/env python3
"""Where a kernel's warps wait, by source line: an ncu source page (SASS) joined
with nvdisasm's line info, so that the samples of a wait loop are named by the
call that waits (which mbarrier, which role) rather than by its opcode (BRA).

    ncu --import R.ncu-rep --page source --csv --print-source sass > R.csv
    cuobjdump -xelf sm90_backward_d1024.sm_90.cubin build/libffpa.so
    nvdisasm -gi -c sm90_backward_d1024.sm_90.cubin > d1024.sass
    python3 scripts/ncu_source_lines.py R.csv d1024.sass --kernel 'Li1024ELNS1_4RoleE0' [--top 25] [--depth 4]

--kernel: a substring of the mangled name that picks one function of the
cubin (the one the report profiled). Prints the instructions with the most
samples (share, address, instruction, the inline chain innermost first to
--depth frames), then the samples summed by call site (the first frame of the
chain outside the toolkit's headers and the wrappers named by --skip). The addresses are the
offsets from the function's first instruction in both files.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict

from ncu_opcode_table import number, read_source_page  # the same source page, read one way

LOCATION = re.compile(r'\s*//## File "([^"]+)", line (\d+)')
INSTRUCTION = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")


def sass_lines(path: str, kernel: str) -> dict[int, tuple[list[tuple[str, int]], str]]:
    """Offset -> (inline chain innermost first as (file name, line), instruction) of the function matching kernel."""
    lines = open(path).read().splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.startswith(".text.") and kernel in line)
    except StopIteration:
        sys.exit(f"ncu_source_lines: no function with {kernel!r} in {path}")
    result: dict[int, tuple[list[tuple[str, int]], str]] = {}
    chain: list[tuple[str, int]] = []
    after_location = False
    for line in lines[start + 1 :]:
        if line.startswith(".text.") or line.startswith("//-----"):
            break
        match = LOCATION.match(line)
        if match:  # a run of location lines: the innermost frame first, then each caller
            if not after_location:
                chain = []
            chain.append((match.group(1).rsplit("/", 1)[-1], int(match.group(2))))
            after_location = True
            continue
        after_location = False
        match = INSTRUCTION.match(line)
        if match:
            result[int(match.group(1), 16)] = (chain, match.group(2))
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv")
    parser.add_argument("sass")
    parser.add_argument("--kernel", required=True)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--skip", default="ptx.cuh,cta.cuh,partial_exchange.cuh,wgmma.cuh",
                        help="comma-separated file names of wrappers a call site is not, beside the toolkit's "
                             ".h headers (default: %(default)s)")
    args = parser.parse_args()
    sass = sass_lines(args.sass, args.kernel)
    skip = set(args.skip.split(","))
    rows = read_source_page(args.csv)
    base = int(rows[0]["Address"], 16)
    total = 0.0
    samples = []
    by_site: dict[str, float] = defaultdict(float)
    for row in rows:
        count = number(row["Warp Stall Sampling (All Samples)"])
        total += count
        chain, instruction = sass.get(int(row["Address"], 16) - base, ([], "?"))
        samples.append((count, int(row["Address"], 16) - base, instruction, chain))
        site = next((f"{name}:{line}" for name, line in chain if not (name.endswith(".h") or name in skip)), "?")
        by_site[site] += count
    if total == 0:
        sys.exit("ncu_source_lines: no samples")
    samples.sort(key=lambda s: -s[0])
    print(f"total samples {total:.0f}\n")
    print("| share | offset | instruction | inline chain (innermost first) |\n|---|---|---|---|")
    for count, offset, instruction, chain in samples[: args.top]:
        frames = " <- ".join(f"{name}:{line}" for name, line in chain[: args.depth])
        print(f"| {count / total * 100:.1f} % | {offset:06x} | `{instruction[:60]}` | {frames} |")
    print("\n| call site | share |\n|---|---|")
    for site, count in sorted(by_site.items(), key=lambda item: -item[1])[: args.top]:
        print(f"| {site} | {count / total * 100:.1f} % |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
