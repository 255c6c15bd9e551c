"""bench/compass_serving.py's pure parts, torch-free: the length draws, the block tables, the per-sequence
pair and key counts (against brute force), bytes and FLOPs, the compass JSON merge, the command line and a
--dry-run end to end. One test (torch and the library) runs every case at --tiny sizes on the CPU reference
and checks ffpa's and every SDPA column's output against the fp32 reference."""

from __future__ import annotations

import copy
import json
import math
import statistics
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import compass_serving as cs  # noqa: E402


def brute_pairs(nq: int, nkv: int, causal: bool, window_left: int = -1) -> int:
    """Attended (query, key) pairs, bottom-right alignment, counted one by one."""
    count = 0
    for i in range(nq):
        p = i + nkv - nq
        for j in range(nkv):
            if causal and j > p:
                continue
            if window_left >= 0 and j < p - window_left:
                continue
            count += 1
    return count


def brute_keys(nq: int, nkv: int, causal: bool, window_left: int = -1) -> int:
    keys = set()
    for i in range(nq):
        p = i + nkv - nq
        keys.update(j for j in range(nkv) if (not causal or j <= p) and (window_left < 0 or j >= p - window_left))
    return len(keys)


# --- lengths ---------------------------------------------------------------------------------------------


def test_lognormal_lengths_are_seeded_clipped_and_centred_on_the_mean(rng):
    seed = rng.randrange(1 << 30)
    lengths = cs.lognormal_lengths(32, 8192, 32768, seed)
    assert lengths == cs.lognormal_lengths(32, 8192, 32768, seed)
    assert lengths != cs.lognormal_lengths(32, 8192, 32768, seed + 1)
    assert all(1 <= n <= 32768 for n in lengths)
    clipped = cs.lognormal_lengths(200, 8192, 9000, seed)
    assert max(clipped) == 9000 and min(clipped) >= 1
    many = cs.lognormal_lengths(20000, 8192, 1 << 40, seed)  # unclipped: the mean is the named one
    assert statistics.mean(many) == pytest.approx(8192, rel=0.03)
    assert statistics.median(many) == pytest.approx(8192 * math.exp(-cs.SIGMA**2 / 2), rel=0.03)


def test_lognormal_split_sums_to_the_total(rng):
    for _ in range(50):
        count = rng.randrange(1, 20)
        total = rng.randrange(count, 100000)
        seed = rng.randrange(1 << 30)
        lengths = cs.lognormal_split(total, count, seed)
        assert len(lengths) == count and sum(lengths) == total and min(lengths) >= 1
        assert lengths == cs.lognormal_split(total, count, seed)
    with pytest.raises(ValueError):
        cs.lognormal_split(3, 4, 0)


def test_the_cases_batches():
    seed = 4321
    by_id = {c.id: cs.case_sequences(c, seed) for c in cs.CASES}
    decode = by_id["paged-decode-gemma4-b32"]
    assert len(decode) == 32 and all(nq == 1 for nq, _ in decode) and max(n for _, n in decode) <= 32768
    for other in ("paged-decode-p1", "paged-decode-p64", "fp8kv-decode-d512"):  # the same batch
        assert by_id[other] == decode
    prefill = by_id["varlen-prefill-d512"]
    assert len(prefill) == 8 and sum(n for n, _ in prefill) == 32768 and all(q == k for q, k in prefill)
    assert by_id["mixed-batch-d512"] == [(4096, 4096)] + [(1, 8192)] * 64
    assert by_id["d256-window1024"] == [(8192, 8192)]
    for case in cs.CASES:  # tiny versions keep the kind and the options
        small = cs.tiny(case)
        assert (small.kind, small.page_size, small.kv_dtype, small.Hq == small.Hkv) == \
            (case.kind, case.page_size, case.kv_dtype, case.Hq == case.Hkv)
        assert len(cs.case_sequences(small, seed)) == small.B


# --- pages -----------------------------------------------------------------------------------------------


def test_shuffled_block_table_uses_every_page_once(rng):
    for page_size in (1, 3, 16, 64):
        lengths = [rng.randrange(0, 300) for _ in range(rng.randrange(1, 9))]
        seed = rng.randrange(1 << 30)
        table, num_blocks = cs.shuffled_block_table(lengths, page_size, seed)
        counts = cs.page_counts(lengths, page_size)
        assert counts == [math.ceil(n / page_size) for n in lengths]
        assert num_blocks == max(1, sum(counts))
        assert len({len(row) for row in table}) == 1 and len(table[0]) == max(1, *counts)
        used = [page for row, count in zip(table, counts) for page in row[:count]]
        assert sorted(used) == list(range(sum(counts)))
        assert all(page == 0 for row, count in zip(table, counts) for page in row[count:])
        assert (table, num_blocks) == cs.shuffled_block_table(lengths, page_size, seed)
    table, _ = cs.shuffled_block_table([4096], 1, 7)
    assert table[0] != list(range(4096))  # shuffled


# --- pairs, keys, bytes, FLOPs -----------------------------------------------------------------------------


def test_attended_pairs_and_keys_against_brute_force(rng):
    shapes = [(1, 1), (1, 37), (5, 5), (4, 19), (19, 4), (33, 33), (7, 100)]
    shapes += [(rng.randrange(1, 40), rng.randrange(1, 60)) for _ in range(30)]
    for nq, nkv in shapes:
        for window in (-1, 0, 1, 5, rng.randrange(0, 70)):
            expected = brute_pairs(nq, nkv, True, window)
            if nq == nkv and window < 0:
                expected = nq * nkv / 2  # the compass's halving for causal Nq == Nkv
            assert cs.attended_pairs(nq, nkv, True, window) == expected, (nq, nkv, window)
            assert cs.keys_read(nq, nkv, True, window) == brute_keys(nq, nkv, True, window), (nq, nkv, window)
        assert cs.attended_pairs(nq, nkv, False) == nq * nkv == brute_pairs(nq, nkv, False)
        assert cs.keys_read(nq, nkv, False) == nkv
    assert cs.attended_pairs(0, 5, True) == cs.attended_pairs(5, 0, True) == cs.keys_read(0, 5, True) == 0
    assert cs.attended_pairs(1, 8192, True) == 8192  # a decode row attends its whole context
    assert cs.attended_pairs(8192, 8192, True, 1023) == 1024 * 8192 - 1023 * 1024 // 2
    with pytest.raises(ValueError):
        cs.attended_pairs(4, 4, False, 2)


def test_bytes_and_flops_of_a_batch():
    case = cs.ServingCase("t", "decode", B=2, tokens=4, Hq=4, Hkv=2, D=8, page_size=16, max_len=64)
    batch = cs.Batch(case, ((1, 3), (1, 5)))
    assert batch.kv_bytes() == (3 + 5) * 2 * (8 + 8) * 2
    assert batch.flops() == 2 * 4 * (8 + 8) * (3 + 5)
    assert batch.dense_shape() == (2, 1, 4)
    assert batch.dense_kv_bytes() == 2 * 4 * 2 * 16 * 2
    assert batch.dense_flops() == 2 * 2 * 4 * 16 * 4
    fp8 = cs.Batch(cs.replace(case, kv_dtype="e4m3"), batch.seqs)
    assert fp8.kv_bytes() * 2 == batch.kv_bytes() and fp8.dense_kv_bytes() == batch.dense_kv_bytes()
    prefill = cs.Batch(cs.ServingCase("p", "prefill", B=2, tokens=10, Hq=2, Hkv=1, D=4), ((4, 4), (6, 6)))
    assert prefill.flops() == 2 * 2 * 8 * (16 / 2 + 36 / 2)
    assert prefill.dense_shape() == (2, 5, 5) and prefill.dense_flops() == 2 * 2 * 2 * 8 * 25 / 2
    window = cs.Batch(cs.ServingCase("w", "window", B=1, tokens=6, Hq=1, Hkv=1, D=4, window_left=1), ((6, 6),))
    assert window.flops() == 2 * 8 * (1 + 2 * 5)
    mixed = cs.Batch(cs.ServingCase("m", "mixed", B=3, tokens=9, prefill=4, Hq=2, Hkv=1, D=4), ((4, 4), (1, 9), (1, 9)))
    assert mixed.kv_bytes() == (4 + 9 + 9) * 8 * 2 and mixed.sample_sequences() == [0, 1, 2]


def test_rows_and_goals():
    batch = cs.Batch(cs.CASES[0], tuple(cs.case_sequences(cs.CASES[0], 1)))
    row = cs.case_row(batch.case, batch, 1, tiny_run=False)
    results = {"ffpa": {"ms": 1.0, "rel_err": 1e-3}, "dense_ffpa": {"ms": 0.9}, "dense_ffpa_split_d": {"ms": 1.2},
               "gather": {"ms": 3.0}, "default": {"ms": None, "reason": "skipped"},
               "gather + default": {"ms": None, "reason": "skipped"}, "efficient (GQA by hand)": {"ms": 2.0},
               "gather + efficient (GQA by hand)": {"ms": 5.0}, "flash": {"ms": None, "reason": "D > 256"}}
    cs.finish_row(row, results, copy_gbps=4000.0)
    assert row["ffpa_gbps"] == pytest.approx(batch.kv_bytes() / 1e6)
    assert row["vs_dense"]["gbps"] == pytest.approx(batch.kv_bytes() / batch.dense_kv_bytes() * 0.9)
    assert row["hbm_fraction"] == pytest.approx(row["ffpa_gbps"] / 4000.0)
    assert (row["sdpa_best_backend"], row["sdpa_best_ms"]) == ("gather + efficient (GQA by hand)", 5.0)
    assert (row["sdpa_alone_best_backend"], row["sdpa_alone_best_ms"]) == ("efficient (GQA by hand)", 2.0)
    assert (row["gather_ms"], row["sdpa_default_ms"]) == (3.0, None)
    assert row["sdpa_default_reason"] == "skipped" and row["speedup_vs_sdpa_best"] == 5.0
    assert row["goal"]["met"] == (row["vs_dense"]["gbps"] >= 0.90)
    assert cs.goal_of("paged-decode-p1", {"vs_dense": {"gbps": 0.76}})["met"] is True
    assert cs.goal_of("paged-decode-p64", {"vs_dense": {"gbps": 0.89}})["met"] is False
    assert cs.goal_of("varlen-prefill-d512", {"vs_dense": None})["met"] is None
    assert cs.goal_of("fp8kv-decode-d512", {"hbm_fraction": 0.9, "kv_bytes_vs_bf16": 0.5})["met"] is True
    assert cs.goal_of("fp8kv-decode-d512", {"hbm_fraction": 0.8, "kv_bytes_vs_bf16": 0.5})["met"] is False
    assert cs.goal_of("mixed-batch-d512", {}) is None


# --- the compass JSON --------------------------------------------------------------------------------------


def compass_file() -> dict:
    return {"gpu": "NVIDIA H200", "date": "2026-12-01", "commit": "abc", "dirty": True, "torch": "2.11", "note": "kept",
            "rows": [{"case": "d64", "ffpa_ms": 1.0}, {"case": "paged-decode-p1", "ffpa_ms": 9.0},
                     {"case": "d512", "ffpa_ms": 2.0}, {"case": "host-us", "ffpa_us": 18.0}]}


def test_merge_replaces_rows_in_place_and_keeps_the_rest():
    existing = compass_file()
    before = copy.deepcopy(existing)
    run = {"date": "2026-12-02", "commit": "def", "dirty": False, "gpu": "NVIDIA H200", "torch": "2.11"}
    rows = [{"case": "paged-decode-p1", "ffpa_ms": 1.5}, {"case": "varlen-prefill-d512", "ffpa_ms": 3.0}]
    merged = cs.merge_report(existing, rows, run, stamp=False)
    assert existing == before  # not modified
    assert [r["case"] for r in merged["rows"]] == ["d64", "paged-decode-p1", "d512", "varlen-prefill-d512", "host-us"]
    assert merged["rows"][1]["ffpa_ms"] == 1.5 and merged["rows"][0] == before["rows"][0]
    assert {k: v for k, v in merged.items() if k not in ("rows", "serving_run")} == \
        {k: v for k, v in before.items() if k != "rows"}
    assert merged["serving_run"] == run
    stamped = cs.merge_report(existing, rows, run, stamp=True)
    assert (stamped["date"], stamped["commit"], stamped["dirty"]) == ("2026-12-02", "def", False)
    assert stamped["note"] == "kept"
    again = cs.merge_report(merged, rows, run, stamp=False)  # a second merge changes nothing
    assert again == merged
    fresh = cs.merge_report(None, rows, run, stamp=False)
    assert fresh["rows"] == rows and (fresh["gpu"], fresh["commit"]) == ("NVIDIA H200", "def")
    no_host = cs.merge_report({"rows": [{"case": "d64"}]}, rows, run, stamp=False)
    assert [r["case"] for r in no_host["rows"]] == ["d64", "paged-decode-p1", "varlen-prefill-d512"]


# --- the command line --------------------------------------------------------------------------------------


def test_dry_run_merges_into_a_compass_file(tmp_path, capsys):
    out, markdown = tmp_path / "compass.json", tmp_path / "compass_serving.md"
    out.write_text(json.dumps(compass_file()))
    assert cs.main(["--dry-run", "--out", str(out), "--markdown", str(markdown)]) == 0
    report = json.loads(out.read_text())
    ids = [r["case"] for r in report["rows"]]
    assert ids[:3] == ["d64", "paged-decode-p1", "d512"] and ids[-1] == "host-us"
    assert set(ids) == {"d64", "d512", "host-us", *(c.id for c in cs.CASES)}
    assert (report["date"], report["commit"], report["note"]) == ("2026-12-01", "abc", "kept")
    assert report["serving_run"]["dry_run"] and report["serving_run"]["complete"]
    rows = {r["case"]: r for r in report["rows"]}
    fp8 = rows["fp8kv-decode-d512"]
    assert fp8["ffpa_ms"] is None and fp8["reason"] and fp8["kv_bytes_vs_bf16"] == 0.5
    for case in cs.CASES:
        row = rows[case.id]
        for key in ("ffpa_gbps", "dense_ffpa_gbps", "dense_ffpa_tflops", "ffpa_ms", "ffpa_tflops", "sdpa_best_ms",
                    "sdpa_best_backend", "sdpa_default_ms", "rel_err", "vs_dense"):
            assert key in row, (case.id, key)
        assert ("hbm_fraction" in row) == (case.kind == "decode")
    text = markdown.read_text()
    assert "Dry run" in text and all(c.id in text for c in cs.CASES)
    assert "paged-decode-p1" in capsys.readouterr().out


def test_list_and_bad_command_lines(capsys):
    assert cs.main(["--list", "--cases", "paged-*"]) == 0
    listed = capsys.readouterr().out
    assert "paged-decode-p64" in listed and "varlen" not in listed
    for argv in (["--iters", "5"], ["--device", "cpu"], ["--stamp"], ["--cases", "nope"],
                 ["--out", "/no/such/dir/compass.json"]):
        with pytest.raises(SystemExit) as raised:
            cs.parse_args(argv)
        assert raised.value.code == 2, argv
    assert cs.parse_args(["--tiny", "--iters", "2"]).iters == 2
    committed = str(cs.bc.REPO_ROOT / "docs/perf/compass.json")
    for argv in (["--tiny", "--out", committed], ["--dry-run", "--out", committed],
                 ["--dry-run", "--markdown", str(cs.bc.REPO_ROOT / "docs/perf/compass_serving.md")]):
        with pytest.raises(SystemExit):  # toy and synthetic rows never replace the measured ones
            cs.parse_args(argv)
    assert cs.parse_args(["--out", committed]).out == committed


# --- the plumbing on the CPU reference ---------------------------------------------------------------------


def test_tiny_cases_on_the_cpu_reference(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "compass.json"
    argv = ["--device", "cpu", "--tiny", "--rounds", "1", "--iters", "1", "--warmup", "0", "--out", str(out)]
    assert cs.main(argv) == 0
    report = json.loads(out.read_text())
    assert report["serving_run"]["complete"] and report["serving_run"]["tiny"]
    assert [r["case"] for r in report["rows"]] == [c.id for c in cs.CASES]
    for row in report["rows"]:
        assert not row.get("error"), row
        assert row["tiny"] and row["ffpa_ms"] is not None and "ffpa_nan" not in row, row["case"]
        assert row["rel_err"] < 1e-2, row["case"]
        checked = {name: c["rel_err"] for name, c in row["columns"].items() if c.get("rel_err") is not None}
        assert "default" in checked and "math" in checked, (row["case"], checked)  # SDPA's side is checked too
        assert all(err < 1e-2 for err in checked.values()), (row["case"], checked)
        if row["page_size"]:
            assert row["gather_ms"] is not None and row["sdpa_best_backend"].startswith("gather + ")
