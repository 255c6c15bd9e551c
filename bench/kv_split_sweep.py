#!/usr/bin/env python3
"""The split-KV rule against measured split counts (issue 12).

For each point, ffpa-bench runs the library's own plan (`auto`) and the same
plan with the keys forced into about N splits (`--kv-splits N`, 1: unsplit),
interleaved point by point, the order rotated every round. The table says
which count was fastest, how the plan's count compares with it, and how the
unsplit path compares with the plan.

    python3 bench/kv_split_sweep.py --bench build/tools/ffpa-bench \\
        --jsonl kv_split_sweep.jsonl --markdown kv_split_sweep.md
    python3 bench/kv_split_sweep.py --chart kv_split_sweep.png --from-jsonl kv_split_sweep.jsonl

The chart: per point, its time at each actual split count relative to its
fastest count (1 = the unsplit path), the plan's count marked.
"""
import argparse
import json
import statistics
import subprocess
import sys

# name -> ffpa-bench arguments (bf16, bhnd, D = 512 unless given).
POINTS = {
    "decode-b1-n512": "--batch 1 --heads-q 32 --seq-q 1 --seq-kv 512",
    "decode-b1-n2k": "--batch 1 --heads-q 32 --seq-q 1 --seq-kv 2048",
    "decode-b1-n8k": "--batch 1 --heads-q 32 --seq-q 1 --seq-kv 8192",
    "decode-b1-n32k": "--batch 1 --heads-q 32 --seq-q 1 --seq-kv 32768",
    "decode-b1-n128k-gqa8": "--batch 1 --heads-q 32 --heads-kv 4 --seq-q 1 --seq-kv 131072",
    "decode-b8-gqa32-8": "--batch 8 --heads-q 32 --heads-kv 8 --seq-q 1 --seq-kv 8192",
    "specdec-b4-q4-gqa32-8": "--batch 4 --heads-q 32 --heads-kv 8 --seq-q 4 --seq-kv 8192",
    "decode-b8-mha-n512": "--batch 8 --heads-q 32 --seq-q 1 --seq-kv 512",
    "decode-b8-mha-n2k": "--batch 8 --heads-q 32 --seq-q 1 --seq-kv 2048",
    "decode-b64-gqa32-4-n8k": "--batch 64 --heads-q 32 --heads-kv 4 --seq-q 1 --seq-kv 8192",
    "decode-b1-n8k-d256": "--batch 1 --heads-q 32 --seq-q 1 --seq-kv 8192 --head-dim 256",
    "decode-b1-n8k-d1024": "--batch 1 --heads-q 32 --seq-q 1 --seq-kv 8192 --head-dim 1024",
    "nq64-gqa32-8-n8k": "--batch 1 --heads-q 32 --heads-kv 8 --seq-q 64 --seq-kv 8192",
    "prefill-h2-q1024-k4096": "--batch 1 --heads-q 2 --seq-q 1024 --seq-kv 4096",
    "prefill-h8-q512-k16k": "--batch 1 --heads-q 8 --seq-q 512 --seq-kv 16384",
}
COUNTS = ["auto", 1, 2, 4, 8, 16, 32, 64]

# --grid: attention_bench.py's decode_grid (issue 12's sweep: Nq = 1, D = 512,
# Hq = 32, Nkv x B x GQA where K and V fit 24 GB), the plan against the unsplit
# path, inputs drawn on the GPU (tens of GB would take the host minutes).
GRID = {
    f"grid-b{b}-gqa{g}-n{n}": f"--batch {b} --heads-q 32 --heads-kv {32 // g} --seq-q 1 --seq-kv {n} --head-dim 512"
    for g in (1, 4, 8) for b in (1, 8, 64) for n in (512, 2048, 8192, 32768, 131072)
    if 2 * b * (32 // g) * n * 512 * 2 <= 24 * 2**30
}
GRID_OPTS = "--warmup 3 --iters 10 --check-rows 0 --device-inputs"


def run_point(bench, args, count, opts):
    cmd = [bench] + args.split() + opts.split() + ["--impl", "sm90", "--json"]
    if count != "auto":
        cmd += ["--kv-splits", str(count)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": (proc.stderr.strip().splitlines() or ["exit %d" % proc.returncode])[-1]}
    return json.loads(lines[-1])


def summarize(rows):
    by = {}
    for r in rows:
        if "error" in r["result"]:
            continue
        by.setdefault(r["point"], {}).setdefault(str(r["count"]), []).append(r["result"])
    out = ["| point | plan (splits) | plan ms | best forced (splits) | best ms | plan / best | unsplit ms | unsplit / plan |",
           "|---|---|---|---|---|---|---|---|"]
    for point, counts in by.items():
        med = {c: statistics.median(x["time_ms"]["median"] for x in v) for c, v in counts.items()}
        actual = {c: v[0].get("kv_splits", 0) for c, v in counts.items()}
        if "auto" not in med:
            continue
        forced = {c: t for c, t in med.items() if c != "auto"}
        best = min(forced, key=forced.get)
        unsplit = med.get("1")
        out.append("| %s | %d | %.4f | %d | %.4f | %.2f | %s | %s |" % (
            point, actual["auto"], med["auto"], actual[best], forced[best], med["auto"] / forced[best],
            "%.4f" % unsplit if unsplit else "-", "%.2f" % (unsplit / med["auto"]) if unsplit else "-"))
    return "\n".join(out) + "\n"


def finish_chart(fig, ax, path, xlabel, ylabel, title, legend_columns):
    ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=legend_columns)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def grid_point(name):
    """B, the GQA ratio, Nkv and the K+V gigabytes of a grid point's name."""
    b, g, n = (int(x[1:] if x[0] in "bn" else x[3:]) for x in name.split("-")[1:])
    return b, g, n, 2 * b * (32 // g) * n * 512 * 2 / 1e9


def chart(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    times, plans = {}, {}
    for r in rows:
        res = r["result"]
        if "error" in res:
            continue
        t = times.setdefault(r["point"], {})
        count = res.get("kv_splits", 1)
        t[count] = min(t.get(count, float("inf")), res["time_ms"]["median"])
        if r["count"] == "auto":
            plans[r["point"]] = count  # the last run's plan
    fig, ax = plt.subplots(figsize=(10, 6))
    for point, t in times.items():
        counts = sorted(t)
        best = min(t.values())
        line, = ax.plot(counts, [t[c] / best for c in counts], marker="o", markersize=3, label=point)
        if point in plans and plans[point] in t:
            ax.plot([plans[point]], [t[plans[point]] / best], marker="*", markersize=12, color=line.get_color())
    ax.set_yscale("log", base=2)
    finish_chart(fig, ax, path, "KV splits (1 = unsplit)", "time / fastest count's time",
                 "ffpa split-KV: time against split count (star: the plan's count), H200", 2)


def grid_chart(rows, path):
    """K+V TB/s against Nkv per (B, GQA): the plan solid, the unsplit path dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = {}
    for r in rows:
        res = r["result"]
        if "error" in res or not r["point"].startswith("grid-"):
            continue
        b, g, n, gb = grid_point(r["point"])
        tb_s = gb / res["time_ms"]["median"]
        series.setdefault((b, g, str(r["count"])), []).append((n, tb_s))
    fig, ax = plt.subplots(figsize=(10, 6))
    colors = {}
    for (b, g, count), points in sorted(series.items()):
        points.sort()
        color = colors.setdefault((b, g), f"C{len(colors)}")
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3, color=color,
                linestyle="-" if count == "auto" else "--",
                label=f"B{b} GQA{g} " + ("plan" if count == "auto" else "unsplit"))
    finish_chart(fig, ax, path, "Nkv", "K+V TB/s",
                 "ffpa decode (Nq 1, D 512, Hq 32): split-KV plan (solid) vs unsplit (dashed), H200", 3)


def grid_table(rows, sdpa_json=None):
    """The grid: plan vs unsplit (ffpa-bench), and SDPA's best from attention_bench's decode_grid JSON."""
    sdpa = {}
    if sdpa_json:
        with open(sdpa_json) as f:
            report = json.load(f)
        for r in report["rows"]:
            key = f"grid-b{r['B']}-gqa{32 // r['Hkv']}-n{r['Nkv']}"
            best = [(v["median_ms"], name) for name, v in r["results"].items()
                    if name != "ffpa" and v.get("status") == "ok"]
            if best:
                sdpa[key] = min(best)
    t = {}
    for r in rows:
        res = r["result"]
        if "error" in res:
            continue
        t.setdefault(r["point"], {})[str(r["count"])] = (res["time_ms"]["median"], res.get("kv_splits", 1),
                                                          res.get("heads_per_tile", 1))
    out = ["| B | GQA | Nkv | K+V GB | plan (heads x splits) | plan ms | plan TB/s | unsplit ms | unsplit / plan |"
           " SDPA best ms (backend) | SDPA / plan |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, args in GRID.items():
        if key not in t or "auto" not in t[key]:
            continue
        b, g, n, gb = grid_point(key)
        plan_ms, splits, heads = t[key]["auto"]
        un = t[key].get("1", (None,))[0]
        sd = sdpa.get(key)
        out.append("| %d | %d | %d | %.2f | %d x %d | %.4f | %.2f | %s | %s | %s | %s |" % (
            b, g, n, gb, heads, splits, plan_ms, gb / plan_ms, "%.4f" % un if un else "-",
            "%.2f" % (un / plan_ms) if un else "-", "%.4f (%s)" % sd if sd else "-",
            "%.2f" % (sd[0] / plan_ms) if sd else "-"))
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", help="ffpa-bench binary")
    ap.add_argument("--jsonl", help="where the runs go")
    ap.add_argument("--chart", help="a PNG of the runs (of this sweep, or of --from-jsonl)")
    ap.add_argument("--from-jsonl", help="draw --chart / --markdown from saved runs, measuring nothing")
    ap.add_argument("--markdown")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--points", help="comma-separated subset of the point names")
    ap.add_argument("--counts", help="comma-separated forced counts (default %s)" % ",".join(map(str, COUNTS[1:])))
    ap.add_argument("--opts", default="--warmup 5 --iters 20 --check-rows 2")
    ap.add_argument("--grid", action="store_true",
                    help="the decode grid's points, the plan against unsplit (--counts 1), inputs on the GPU")
    ap.add_argument("--sdpa-json", help="with --grid: attention_bench.py --cases decode_grid's JSON, for the SDPA column")
    a = ap.parse_args()
    if a.from_jsonl:
        with open(a.from_jsonl) as f:
            rows = [json.loads(line) for line in f]
        if a.chart:
            (grid_chart if a.grid else chart)(rows, a.chart)
        if a.grid and a.markdown:
            with open(a.markdown, "w") as f:
                f.write(grid_table(rows, a.sdpa_json))
        return
    if not a.bench or not a.jsonl:
        ap.error("--bench and --jsonl are required to measure")
    points = GRID if a.grid else POINTS
    if a.grid:
        if a.opts == ap.get_default("opts"):
            a.opts = GRID_OPTS
        if not a.counts:
            a.counts = "1"
    names = a.points.split(",") if a.points else list(points)
    counts_all = ["auto"] + [int(c) for c in a.counts.split(",")] if a.counts else COUNTS
    rows = []
    with open(a.jsonl, "w") as f:
        for rnd in range(a.rounds):
            for i, name in enumerate(names):
                shift = (rnd + i) % len(counts_all)
                counts = counts_all[shift:] + counts_all[:shift]
                for count in counts:
                    r = {"round": rnd, "point": name, "count": count,
                         "result": run_point(a.bench, points[name], count, a.opts)}
                    rows.append(r)
                    f.write(json.dumps(r) + "\n")
                    f.flush()
                print("kv_split_sweep: round %d, %s done" % (rnd + 1, name), file=sys.stderr, flush=True)
    table = grid_table(rows, a.sdpa_json) if a.grid else summarize(rows)
    print(table)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(table)
    if a.chart:
        (grid_chart if a.grid else chart)(rows, a.chart)


if __name__ == "__main__":
    main()
