#!/usr/bin/env python3
"""Reads what scripts/gpu_check.sh's stages leave behind and summarizes it.

    gpu_check_report.py tests GPU_TESTS_JSON     counts of a GoogleTest JSON report
    gpu_check_report.py sanitizer LOG            error counts of one compute-sanitizer run
    gpu_check_report.py bench-rows JSONL         ffpa-bench's points
    gpu_check_report.py attention-rows JSON [CHART_DIR]
                                                 bench/attention_bench.py's rows (and charts)
    gpu_check_report.py report --out DIR --stages TSV --sanitizer-log LOG ...
                                                 writes DIR/report.json, prints the summary

The first four print a one-line detail for the stage table and exit 1 when
what they read shows a failure (or is missing). `report` exits 1 when any
stage failed. Standard library only: it runs before and without torch.
"""

import argparse
import datetime
import json
import os
import re
import sys

SANITIZER_MARK = re.compile(r"^##### compute-sanitizer --tool (\w+)$", re.M)


def gtest_counts(path):
    """{total, passed, failed, skipped, failed_names} of a --gtest_output=json report."""
    with open(path) as f:
        report = json.load(f)
    counts = {"total": 0, "passed": 0, "failed": 0, "skipped": 0, "failed_names": []}
    for suite in report.get("testsuites", []):
        for test in suite.get("testsuite", []):
            if test.get("status") == "NOTRUN":  # disabled
                continue
            counts["total"] += 1
            if test.get("failures"):
                counts["failed"] += 1
                counts["failed_names"].append(f"{suite['name']}.{test['name']}")
            elif test.get("result") == "SKIPPED":
                counts["skipped"] += 1
            else:
                counts["passed"] += 1
    return counts


def sanitizer_counts(text):
    """{errors, warnings, tests_run, summary_found} of one compute-sanitizer run's output."""
    errors = sum(int(n) for n in re.findall(r"ERROR SUMMARY: (\d+) errors?", text))
    warnings = 0
    for _, race_errors, race_warnings in re.findall(
        r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)", text
    ):
        errors = max(errors, int(race_errors))
        warnings += int(race_warnings)
    ran = [int(n) for n in re.findall(r"\[==========\] (\d+) tests? from .* ran", text)]
    return {
        "errors": errors,
        "warnings": warnings,
        "tests_run": sum(ran),
        "summary_found": "ERROR SUMMARY" in text or "RACECHECK SUMMARY" in text,
    }


def sanitizer_sections(text):
    """{tool: output} of the combined sanitizer log."""
    parts = SANITIZER_MARK.split(text)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def read_jsonl(path):
    rows = []
    if os.path.exists(path):
        with open(path) as f:
            rows = [json.loads(line) for line in f if line.strip().startswith("{")]
    return rows


def bench_row(p):
    """The numbers of one ffpa-bench point worth keeping in the report."""
    check = p.get("check") or {}
    return {
        "point": f"D={p['head_dim']} B={p['batch']} Hq={p['heads_q']} Hkv={p['heads_kv']} Nq={p['seq_q']} "
        f"Nkv={p['seq_kv']} {p['dtype']} {p['layout']} causal={p['causal']} mask={p['mask']}"
        + (f" dropout={p['dropout']:g}" if p["dropout"] else ""),
        "kernel": p["kernel"],
        "median_ms": p["time_ms"]["median"],
        "tflops": p["tflops"]["median"],
        "rel_l2": check.get("rel_l2"),
        "check_passed": check.get("passed"),
        "extra_device_bytes": (p.get("memory") or {}).get("extra_device_bytes"),
    }


METRIC_UNITS = {"tflops": "TFLOP/s", "kv_gb_per_s": "K+V GB/s"}


def attention_row(r, sweeps):
    """One attention_bench case in the sweep's metric (TFLOP/s, or GB/s for decode)."""
    metric = sweeps.get(r["sweep"], {}).get("metric", "tflops")
    ffpa = r["results"].get("ffpa", {})
    best = r["results"].get(r["best_sdpa"], {}) if r.get("best_sdpa") else {}
    return {
        "sweep": r["sweep"],
        "case": r["case"],
        "unit": METRIC_UNITS[metric],
        "ffpa": ffpa.get(metric),
        "ffpa_status": ffpa.get("status", "not run"),
        "best_sdpa": r.get("best_sdpa"),
        "best_sdpa_value": best.get(metric),
        "speedup": r.get("speedup"),
        "ffpa_rel_l2": r.get("ffpa_rel_l2"),
        "passed": r.get("passed"),
        "error": r.get("error"),
    }


def load_json(path):
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def chart_files(directory):
    if not directory or not os.path.isdir(directory):
        return []
    return sorted(os.path.join(directory, n) for n in os.listdir(directory) if n.endswith(".png"))


# --- the stage details ---------------------------------------------------------------


def detail_tests(path):
    if not os.path.exists(path):
        print("no JSON report: the binary crashed or timed out before writing it")
        return 1
    c = gtest_counts(path)
    print(f"{c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped")
    return 1 if c["failed"] or c["passed"] == 0 else 0  # all skipped: the suite saw no GPU


def detail_sanitizer(path):
    with open(path, errors="replace") as f:
        c = sanitizer_counts(f.read())
    text = f"{c['errors']} errors, {c['warnings']} warnings, {c['tests_run']} tests"
    if c["tests_run"] == 0:
        text += " (the filter matched no test, or the run died)"
    elif not c["summary_found"]:
        text += " (no sanitizer summary)"
    print(text)
    return 1 if c["errors"] or c["tests_run"] == 0 or not c["summary_found"] else 0


def detail_bench_rows(path):
    rows = [bench_row(p) for p in read_jsonl(path)]
    failed = sum(1 for r in rows if r["check_passed"] is False)
    print(f"{len(rows)} points, {failed} failed checks")
    return 1 if failed or not rows else 0


def detail_attention_rows(path, chart_dir):
    report = load_json(path)
    if report is None:
        print(f"no {os.path.basename(path)}: the benchmark stopped before its first case")
        return 1
    rows = report["rows"]
    failed = sum(1 for r in rows if not r.get("passed"))
    text = f"{len(rows)} rows, {failed} failed"
    complete = report.get("complete", False)
    if not complete:
        text += f", incomplete ({len(rows)} of {report.get('cases_planned', '?')} cases)"
    charts = chart_files(chart_dir)
    if chart_dir:
        text += f", {len(charts)} charts"
    print(text)
    return 1 if failed or not rows or not complete or (chart_dir and not charts) else 0


# --- the report -----------------------------------------------------------------------


def fmt(value, pattern):
    return "n/a" if value is None else pattern % value


def write_report(args):
    stages = []
    with open(args.stages) as f:
        for line in f:
            name, status, seconds, detail = line.rstrip("\n").split("\t", 3)
            stages.append({"name": name, "status": status, "seconds": int(seconds), "detail": detail})

    out = args.out
    tests_path = os.path.join(out, "gpu_tests.json")
    sanitizer = {}
    if args.sanitizer_log and os.path.exists(args.sanitizer_log):
        with open(args.sanitizer_log, errors="replace") as f:
            sanitizer = {tool: sanitizer_counts(text) for tool, text in sanitizer_sections(f.read()).items()}
    bench = [bench_row(p) for p in read_jsonl(os.path.join(out, "ffpa_bench.jsonl"))]
    attention_report = load_json(os.path.join(out, "attention_bench.json"))
    attention = []
    if attention_report:
        attention = [attention_row(r, attention_report.get("sweeps", {})) for r in attention_report["rows"]]
    device = next((s["detail"] for s in stages if s["name"] == "device"), "unknown")
    failed = [s["name"] for s in stages if s["status"] != "passed"]

    report = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": device,
        "build": args.build,
        "quick": args.quick == "1",
        "only": args.only,
        "passed": not failed,
        "failed_stages": failed,
        "stages": stages,
        "tests": gtest_counts(tests_path) if os.path.exists(tests_path) else None,
        "sanitizer": sanitizer,
        "bench": {
            "ffpa_bench": bench,
            "attention_bench": {
                "complete": attention_report.get("complete") if attention_report else None,
                "charts": [os.path.relpath(p, out) for p in chart_files(os.path.join(out, "charts"))],
                "rows": attention,
            },
        },
    }
    with open(os.path.join(out, "report.json"), "w") as f:
        json.dump(report, f, indent=1)

    print()
    print("==== gpu_check summary " + "=" * 40)
    for s in stages:
        print(f"{s['name']:<10} {s['status']:<9} {s['seconds']:>4}s  {s['detail']}")
    for r in bench:
        print(f"ffpa-bench {r['point']}: {fmt(r['tflops'], '%.1f')} TFLOP/s, rel L2 {fmt(r['rel_l2'], '%.1e')}, "
              f"extra device memory {fmt(r['extra_device_bytes'], '%d B')}")
    for r in attention:
        if r["error"]:
            print(f"attn {r['sweep']} {r['case']}: FAIL {r['error']}")
            continue
        ffpa = fmt(r["ffpa"], "%.1f") if r["ffpa_status"] == "ok" else r["ffpa_status"]
        print(f"attn {r['sweep']} {r['case']}: ffpa {ffpa} vs {r['best_sdpa'] or 'no SDPA backend'} "
              f"{fmt(r['best_sdpa_value'], '%.1f')} {r['unit']} ({fmt(r['speedup'], '%.2fx')}), "
              f"err {fmt(r['ffpa_rel_l2'], '%.1e')}" + ("" if r["passed"] else " FAIL"))
    verdict = "PASSED" if not failed else "FAILED (" + ", ".join(failed) + ")"
    print(f"gpu_check: {verdict}; report in {os.path.join(out, 'report.json')}")
    return 1 if failed else 0


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("tests", "sanitizer", "bench-rows"):
        commands.add_parser(name).add_argument("path")
    attention = commands.add_parser("attention-rows")
    attention.add_argument("path")
    attention.add_argument("chart_dir", nargs="?", help="where the charts should be: fails when it holds none")
    report = commands.add_parser("report")
    report.add_argument("--out", required=True)
    report.add_argument("--stages", required=True)
    report.add_argument("--sanitizer-log", default="", help="compute-sanitizer's output, memcheck then racecheck")
    report.add_argument("--build", default="")
    report.add_argument("--quick", default="0")
    report.add_argument("--only", default="all")
    args = parser.parse_args(argv)
    details = {
        "tests": detail_tests,
        "sanitizer": detail_sanitizer,
        "bench-rows": detail_bench_rows,
    }
    if args.command == "report":
        return write_report(args)
    if args.command == "attention-rows":
        return detail_attention_rows(args.path, args.chart_dir)
    return details[args.command](args.path)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
