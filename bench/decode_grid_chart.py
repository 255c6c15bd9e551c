#!/usr/bin/env python3
"""Chart of attention_bench.py's decode_grid sweep (issue 12): K+V GB/s against Nkv, one panel per
GQA ratio, a line per batch size; ffpa solid, the fastest SDPA backend (K/V expanded for GQA) dashed.
    python3 bench/decode_grid_chart.py decode_grid.json decode_grid.png
"""
from __future__ import annotations

import json
import sys
from collections import defaultdict


def best_sdpa_gb_per_s(results: dict) -> float | None:
    rates = [r["kv_gb_per_s"] for name, r in results.items() if name != "ffpa" and r.get("status") == "ok"]
    return max(rates) if rates else None


def main(source: str, target: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    report = json.load(open(source))
    series: dict[int, dict[int, list[tuple[int, float | None, float | None]]]] = defaultdict(lambda: defaultdict(list))
    for row in report["rows"]:
        if row["sweep"] != "decode_grid":
            continue
        ffpa = row["results"].get("ffpa", {})
        ffpa_rate = ffpa.get("kv_gb_per_s") if ffpa.get("status") == "ok" else None
        series[row["Hq"] // row["Hkv"]][row["B"]].append((row["Nkv"], ffpa_rate, best_sdpa_gb_per_s(row["results"])))
    groups = sorted(series)
    figure, axes = plt.subplots(1, len(groups), figsize=(5 * len(groups), 4.2), sharey=True)
    for ax, group in zip(axes, groups):
        for index, (batch, points) in enumerate(sorted(series[group].items())):
            points.sort()
            color = f"C{index}"
            ax.plot([p[0] for p in points], [p[1] for p in points], "o-", color=color, label=f"ffpa B={batch}")
            ax.plot([p[0] for p in points], [p[2] for p in points], "x--", color=color, label=f"SDPA best B={batch}")
        ax.set_xscale("log", base=2)
        ax.set_title(f"GQA {group} (Hq 32, Hkv {32 // group})")
        ax.set_xlabel("Nkv")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("K+V GB/s (higher is better)")
    axes[-1].legend(fontsize=8)
    figure.suptitle(f"Decode, Nq = 1, D = 512, bf16: {report['device']}, {report['date'][:10]}")
    figure.tight_layout()
    figure.savefig(target, dpi=110)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
