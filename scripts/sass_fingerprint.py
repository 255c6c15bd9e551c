#!/usr/bin/env python3
"""Fingerprints of every GPU kernel's SASS in a build, to show that a change
left the machine code alone (docs/kernels/refactor_sass.md).

For each kernel object of the build (one per instantiated head dim and family)
and each architecture in it, the SASS of every kernel is normalized (addresses,
encodings and the kernel's own name dropped) and hashed. Kernels are keyed by
family, head dim, architecture and element/accumulation types read off the
mangled name, so that renamed files and types still pair up.

    python3 scripts/sass_fingerprint.py BUILD_DIR > fingerprints.json
    python3 scripts/sass_fingerprint.py --compare OLD.json NEW.json

Needs cuobjdump (the CUDA toolkit's, or the nvidia-cuda-cuobjdump wheel's).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import subprocess
import sys

# Object files of kernel instances: the family and the head dim from the name.
OBJECT_PATTERNS = [
    # split_d_out / seesaw_d: the object names before the families were renamed.
    (re.compile(r"(?:split_d_out|sm80_split_d_d)(\d+)\.cu\.o$"), "sm80_split_d"),
    (re.compile(r"(?:seesaw_d|sm90_wgmma_d)(\d+)\.cu\.o$"), "sm90_wgmma"),
]


def kernel_types(mangled: str) -> str:
    """The element type and accumulation of a kernel, from its template arguments."""
    element = "bf16" if "nv_bfloat16" in mangled else "f16"
    # split-D: the accumulation flag follows the element type (Lb1E = fp16 accumulation).
    acc = "f16acc" if re.search(r"__halfLb1E", mangled) else "f32acc"
    return f"{element},{acc}"


def normalize(lines: list[str]) -> list[str]:
    out = []
    for line in lines:
        line = re.sub(r"/\*[0-9a-f]{4,}\*/", "", line)  # addresses
        line = re.sub(r"/\* 0x[0-9a-f]+ \*/", "", line)  # encodings
        # Branch and call targets are addresses: one instruction more or less
        # earlier in the kernel moves them all.
        line = re.sub(r"\b(BRA|CALL\.\S+|BSSY(?:\.\S+)?\s+B\d+,|BRX|JMP)(\s+)(?:[^;]*?)0x[0-9a-f]+", r"\1\2<target>", line)
        line = line.strip()
        if line:
            out.append(line)
    return out


def fingerprints(build_dir: str) -> dict[str, dict[str, object]]:
    result: dict[str, dict[str, object]] = {}
    for obj in sorted(glob.glob(os.path.join(build_dir, "**", "*.cu.o"), recursive=True)):
        for pattern, family in OBJECT_PATTERNS:
            m = pattern.search(obj)
            if m:
                break
        else:
            continue
        head_dim = int(m.group(1))
        sass = subprocess.run(["cuobjdump", "-sass", obj], capture_output=True, text=True, check=True).stdout
        arch, function, body = None, None, []

        def flush() -> None:
            if function is None:
                return
            text = "\n".join(normalize(body))
            key = f"{family},d{head_dim},{arch},{kernel_types(function)}"
            result[key] = {
                "sha256": hashlib.sha256(text.encode()).hexdigest()[:16],
                "instructions": sum(1 for line in body if re.search(r"/\*[0-9a-f]{4,}\*/", line)),
                "function": function,
            }

        for line in sass.splitlines():
            if m := re.search(r"arch = (sm_\w+)", line):
                flush()
                arch, function, body = m.group(1), None, []
            elif m := re.search(r"Function : (\S+)", line):
                flush()
                function, body = m.group(1), []
            elif function is not None:
                body.append(line)
        flush()
    return result


def compare(old_path: str, new_path: str) -> int:
    with open(old_path) as f:
        old = json.load(f)
    with open(new_path) as f:
        new = json.load(f)
    print("| kernel | instructions before | after | SASS |")
    print("|---|---|---|---|")
    differing = 0
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if a is None or b is None:
            verdict = "only before" if b is None else "only after"
            differing += 1
        elif a["sha256"] == b["sha256"]:
            verdict = "identical"
        else:
            verdict = "differs"
            differing += 1
        print(f"| {key} | {a['instructions'] if a else '-'} | {b['instructions'] if b else '-'} | {verdict} |")
    print()
    print(f"{len(set(old) | set(new)) - differing} identical, {differing} differing or unpaired")
    return 0


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--compare":
        return compare(sys.argv[2], sys.argv[3])
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    json.dump(fingerprints(sys.argv[1]), sys.stdout, indent=1, sort_keys=True)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
