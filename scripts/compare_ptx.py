#!/usr/bin/env python3
"""Whether a change left kernels' code alone: compares the .entry functions of two PTX files after
renumbering registers and labels in order of appearance (and ignoring debug lines, the .reg declarations and
the kernel parameter's size), so that a pure refactor shows IDENTICAL without a GPU A/B.

Make the PTX of one instance's translation unit with the build's own flags, before and after the change
(each from its own checkout), e.g.:

    nvcc -I$TREE/include -Ibuild/include -I$TREE/src -O3 -DNDEBUG -arch=compute_90a -std=c++17 \\
        -x cu -ptx build/generated/sm90_wgmma_d512.cu -o $TREE.ptx

then `scripts/compare_ptx.py before.ptx after.ptx [--rename OLD=NEW ...]`: --rename maps a piece of an old
mangled name to its new spelling (a template parameter that changed type, say). Exit status 1 when an entry
differs or is missing.
"""

from __future__ import annotations

import argparse
import re
import sys


def entries(path: str) -> dict[str, str]:
    text = open(path, encoding="utf-8").read()
    return {m.group(1): m.group(0) for m in re.finditer(r"\.visible \.entry (\S+)\((.*?)\n\}\n", text, re.S)}


def normalized(body: str, name: str) -> str:
    lines = []
    for line in body.replace(name, "ENTRY").split("\n"):
        stripped = line.strip()
        if stripped.startswith((".loc", "//", ".reg")) or ".b8 ENTRY_param_0[" in stripped:
            continue
        lines.append(line)
    numbers: dict[str, str] = {}

    def renumber(m: re.Match) -> str:
        key = m.group(0)
        if key not in numbers:
            numbers[key] = f"{m.group(1)}#{sum(1 for k in numbers if k.startswith(m.group(1)))}"
        return numbers[key]

    return re.sub(r"(%rd|%rs|%r|%p|%fd|%f|\$L__BB)\d+(_\d+)?", renumber, "\n".join(lines))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--rename", action="append", default=[], help="OLD=NEW, applied to the old entry names")
    args = parser.parse_args()
    renames = [tuple(r.split("=", 1)) for r in args.rename]
    before, after = entries(args.before), entries(args.after)
    failed = False
    for name, body in before.items():
        new_name = name
        for old, new in renames:
            new_name = new_name.replace(old, new)
        if new_name not in after:
            print(f"MISSING   {name}")
            failed = True
            continue
        same = normalized(body, name) == normalized(after[new_name], new_name)
        print(f"{'IDENTICAL' if same else 'DIFF     '} {new_name}")
        failed |= not same
    print(f"{len(before)} entries before, {len(after)} after")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
