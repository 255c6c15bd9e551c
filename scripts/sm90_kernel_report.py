#!/usr/bin/env python3
"""The sm90 family's register and SASS report (docs/kernels/sm90_wgmma_ptxas.md).

Reads a build's log (ninja output with the library's `-Xptxas=-v`) for each
sm90_wgmma kernel's registers, stack and spills, and the SASS of its object files
(cuobjdump, from the CUDA toolkit or any copy on PATH) for the wgmma
instructions (HGMMA) and local-memory accesses (STL/LDL). Prints a markdown
table, and the number of ptxas C7518 warnings (wgmma serialized: a DEPBAR
after every HGMMA), which must be 0.

    ninja -C build > build.log
    python3 scripts/sm90_kernel_report.py build.log build
"""

from __future__ import annotations

import glob
import re
import subprocess
import sys


def ptxas_rows(log: str) -> list[dict[str, str]]:
    rows, current = [], None
    for line in log.splitlines():
        if m := re.search(r"Compiling entry function '(_Z\S*sm90_wgmma\S*)' for '(sm_\w+)'", line):
            current = {"name": m.group(1), "arch": m.group(2)}
        elif current and (m := re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)):
            current["stack"], current["spill_stores"], current["spill_loads"] = m.groups()
        elif current and (m := re.search(r"Used (\d+) registers", line)):
            current["registers"] = m.group(1)
            rows.append(current)
            current = None
    return rows


def sass_counts(build_dir: str) -> dict[str, dict[str, object]]:
    counts: dict[str, dict[str, object]] = {}
    for obj in glob.glob(f"{build_dir}/**/sm90_wgmma_d*.cu.o", recursive=True):
        sass = subprocess.run(["cuobjdump", "-sass", obj], capture_output=True, text=True, check=True).stdout
        function = None
        for line in sass.splitlines():
            if m := re.search(r"Function : (\S+)", line):
                function = m.group(1)
                counts[function] = {"hgmma": 0, "shapes": set(), "local": 0}
            elif function and (m := re.search(r"HGMMA\.(\d+x\d+x\d+)", line)):
                counts[function]["hgmma"] += 1
                counts[function]["shapes"].add(m.group(1))
            elif function and re.search(r"\b(STL|LDL)\b", line):
                counts[function]["local"] += 1
    return counts


def describe(name: str) -> tuple[str, int, int, int, bool]:
    """dtype, this CTA's part of D (S chunks x 64), O columns per consumer, CTAs per tile, dropout variant."""
    m = re.search(r"TraitsI(6__half|13__nv_bfloat16)Li(\d+)ELi(\d+)ELi(\d+)E(Lb([01])E)?", name)
    if not m:
        raise ValueError(f"not a sm90_wgmma kernel: {name}")
    dtype = "f16" if "half" in m.group(1) else "bf16"
    return dtype, int(m.group(2)) * 64, int(m.group(3)), int(m.group(4)), m.group(6) == "1"


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    with open(sys.argv[1]) as f:
        log = f.read()
    rows = ptxas_rows(log)
    serialized = log.count("(C7518)")
    sass = sass_counts(sys.argv[2])
    print("| arch | instance | dtype | registers at launch | stack | spill stores | spill loads | HGMMA in SASS (shapes) | STL/LDL in SASS |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in sorted(rows, key=lambda r: tuple(describe(r["name"])[i] for i in (3, 1, 0, 4))):
        dtype, cta_dim, half, split, dropout = describe(row["name"])
        instance = f"d{cta_dim}" if split == 1 else f"d{split * cta_dim} (cluster of {split}, each CTA D/{split})"
        instance += ", dropout" if dropout else ""
        s = sass.get(row["name"], {"hgmma": "?", "shapes": set(), "local": "?"})
        print(f"| {row['arch']} | {instance}: S over {cta_dim // 64} chunks, O {half} + {half} | {dtype} | "
              f"{row['registers']} | {row['stack']} | {row['spill_stores']} | {row['spill_loads']} | "
              f"{s['hgmma']} ({', '.join(sorted(s['shapes']))}) | {s['local']} |")
    print()
    print(f"ptxas C7518 (wgmma serialized) warnings: {serialized}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
