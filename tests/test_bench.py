"""The benchmarks of `ggml-bitcos bench` run every type in interleaved rounds and print each ratio with its
spread (ggml_bitcos.bench.timing), or "within noise" in words when the rounds do not agree on a difference.

The statistics are tested on given per-round values; the benchmarks by smoke tests on small shapes that
check the measurements exist, are consistent and are printed with their spread, never their speed.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

# a printed ratio with its spread: "1.250x (1.201-1.310)" or "within noise (0.980x, 0.700-1.400)"
RATIO_WITH_SPREAD = re.compile(
    r"\d+\.\d{3}x \(\d+\.\d{3}-\d+\.\d{3}\)|within noise \(\d+\.\d{3}x, \d+\.\d{3}-\d+\.\d{3}\)"
)
# a bare ratio: one not followed by its spread (nor inside a "within noise" cell)
BARE_RATIO = re.compile(r"(?<!\()\b\d+\.\d{3}x(?! \()")


def assert_ratios_with_spread(text: str) -> None:
    """Every ratio of a benchmark's tables comes with its spread: at least one, and none bare."""
    assert RATIO_WITH_SPREAD.search(text), text
    bare = [m.group(0) for m in BARE_RATIO.finditer(text)]
    assert not bare, (bare, text)


# ------------------------------------------------------------------------------------------ statistics
def test_ratio_clear_win_and_clear_loss():
    """Rounds that agree: the median of the per-round ratios, their range, no "within noise"."""
    from ggml_bitcos.bench import timing

    win = timing.speed_ratio([30.0, 31.0, 29.5], [25.0, 25.5, 24.0])  # tokens/s, BITCOS vs TQ2_0
    assert win.ratios == (30 / 25, 31 / 25.5, 29.5 / 24) and win.median == 31 / 25.5
    assert (win.lo, win.hi) == (30 / 25, 29.5 / 24) and not win.within_noise
    assert win.cell() == "1.216x (1.200-1.229)"
    assert (
        win.sentence("tg64: BITCOS / TQ2_0")
        == "tg64: BITCOS / TQ2_0 = 1.216x (per-round range 1.200-1.229 over 3 rounds)"
    )

    loss = timing.time_ratio([10.0, 10.2, 9.9], [12.5, 12.6, 12.4])  # µs: reference first, > 1 = faster
    assert not loss.within_noise and loss.hi < 1.0
    assert loss.cell() == "0.800x (0.798-0.810)"
    assert loss.as_json() == {
        "median": 10.0 / 12.5,
        "min": 9.9 / 12.4,
        "max": 10.2 / 12.6,
        "rounds": 3,
        "per_round": [10.0 / 12.5, 10.2 / 12.6, 9.9 / 12.4],
        "within_noise": False,
    }


def test_ratio_noise_dominated_is_said_in_words():
    """The issue's case (TQ2_0 30.46 +- 24.46 tokens/s): the rounds disagree about which is faster, so the
    ratio is "within noise", not a result. Also when the range excludes 1.0 but is wider than the effect."""
    from ggml_bitcos.bench import timing

    busy = timing.speed_ratio([30.5, 8.0, 40.0], [30.46, 6.0, 55.0])
    assert busy.lo < 1.0 < busy.hi and busy.within_noise
    assert busy.cell() == "within noise (1.001x, 0.727-1.333)"
    text = busy.sentence("tg64: BITCOS / TQ2_0")
    assert text.startswith("tg64: BITCOS / TQ2_0: no measurable difference: 1.001x") and "within noise" in text
    assert busy.as_json()["within_noise"] is True

    wide = timing.speed_ratio([1.05, 1.06, 1.5], [1.0, 1.0, 1.0])  # all > 1, but spread 0.42 > effect 0.06
    assert wide.lo > 1.0 and wide.within_noise
    narrow = timing.speed_ratio([1.05, 1.06, 1.07], [1.0, 1.0, 1.0])  # spread 0.02 < effect 0.06
    assert not narrow.within_noise
    assert timing.speed_ratio([2.0, 2.0], [2.0, 2.0]).within_noise  # no difference at all


def test_ratio_verdict_does_not_depend_on_the_reference():
    """A loss is judged as the inverse win: a 37x loss whose rounds range 24x-91x is a clear loss (its range,
    relative to a ratio of 0.027, is wider than 0.973, which a rule on the ratio itself would call noise),
    and swapping candidate and reference never changes the verdict."""
    from ggml_bitcos.bench import timing

    loss = timing.speed_ratio([1.0, 1.0], [90.9, 23.8])
    assert loss.hi < 0.05 and (loss.hi - loss.lo) / loss.median > 1 - loss.median and not loss.within_noise
    cases = [
        ([30.0, 31.0, 29.5], [25.0, 25.5, 24.0]),
        ([30.5, 8.0, 40.0], [30.46, 6.0, 55.0]),
        ([1.05, 1.06, 1.5], [1.0, 1.0, 1.0]),
        ([1.0, 1.0], [90.9, 23.8]),
        ([10.0, 10.2, 9.9], [12.5, 12.6, 12.4]),
    ]
    for a, b in cases:
        assert timing.speed_ratio(a, b).within_noise == timing.speed_ratio(b, a).within_noise, (a, b)


def test_ratio_rounds_pair_and_one_round_has_no_spread():
    """Ratios pair round i with round i (not medians of each side), need the same number of rounds on both
    sides, and a single round says its spread is unknown; --rounds refuses fewer than two."""
    import argparse

    from ggml_bitcos.bench import timing

    # each round the candidate is 2x faster, though the machine's speed moves 4x between rounds
    paired = timing.speed_ratio([20.0, 80.0, 40.0], [10.0, 40.0, 20.0])
    assert paired.ratios == (2.0, 2.0, 2.0) and not paired.within_noise
    with pytest.raises(ValueError):
        timing.speed_ratio([1.0, 2.0], [1.0])
    one = timing.speed_ratio([30.0], [25.0])
    assert not one.has_spread and not one.within_noise
    assert one.cell() == "1.200x (1 round)" and "spread unknown" in one.sentence("tg")
    assert timing.rounds_type("2") == 2
    with pytest.raises(argparse.ArgumentTypeError):
        timing.rounds_type("1")


def test_merge_rounds_and_value_cell():
    """Records of several rounds merge into one per key: the median, the per-round values in round order."""
    from ggml_bitcos.bench import timing

    runs = [
        [{"k": "a", "us": 10.0, "x": 1}, {"k": "b", "us": 20.0, "x": 2}],
        [{"k": "b", "us": 26.0, "x": 9}, {"k": "a", "us": 14.0, "x": 9}],
        [{"k": "a", "us": 11.0, "x": 9}, {"k": "b", "us": 21.0, "x": 9}],
    ]
    merged = timing.merge_rounds(runs, lambda r: r["k"], "us", "rounds_us")
    assert merged == [
        {"k": "a", "us": 11.0, "x": 1, "rounds_us": [10.0, 14.0, 11.0]},
        {"k": "b", "us": 21.0, "x": 2, "rounds_us": [20.0, 26.0, 21.0]},
    ]
    assert runs[0][0] == {"k": "a", "us": 10.0, "x": 1}  # inputs untouched
    assert timing.value_cell([30.0, 28.1, 33.2]) == "30.00 (28.10-33.20)" and timing.value_cell([7.0]) == "7.00"


# ------------------------------------------------------------------------------------------ benchmarks


def test_bench_gemv_small(tmp_path, patched_llama):
    out = tmp_path / "gemv.json"
    plot = tmp_path / "gemv.png"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "ggml_bitcos",
            "bench",
            "gemv",
            "--rows",
            "256",
            "--k",
            "512",
            "--z",
            "0,0.5,1",
            "--threads",
            "1",
            "--reps",
            "3",
            "--rounds",
            "2",
            "--workdir",
            str(tmp_path / "w"),
            "--json",
            str(out),
            "--plot",
            str(plot),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:]
    assert "vs TQ2_0" in r.stdout and "bitcos_matrix" in r.stdout and "2 round(s)" in r.stdout
    assert_ratios_with_spread(r.stdout)
    data = json.loads(out.read_text())
    res = data["results"]
    assert all(len(x["rounds_us"]) == 2 and x["median_us"] == sum(x["rounds_us"]) / 2 for x in res)
    m_vs_tq2 = [x for x in data["ratios"] if (x["type"], x["z"], x["ref"]) == ("bitcos_matrix", 0.5, "tq2_0")]
    assert len(m_vs_tq2) == 1 and len(m_vs_tq2[0]["per_round"]) == 2 and "within_noise" in m_vs_tq2[0]
    # the default BITCOS types are what `convert` writes (format version 2), at every z
    types = {(x["type"], x["z"]) for x in res}
    assert types == {("tq2_0", None), ("tq1_0", None), ("q4_0", None)} | {
        (t, z) for t in ("bitcos_matrix", "bitcos_b256") for z in (0.0, 0.5, 1.0)
    }
    assert all(x["median_us"] > 0 and x["rows"] == 256 and x["k"] == 512 for x in res)
    # bytes include the companion: MATRIX at z = 1 stores 1 bit per weight plus a small index
    m1 = next(x for x in res if x["type"] == "bitcos_matrix" and x["z"] == 1.0)
    assert 256 * 512 / 8 < m1["bytes"] < 256 * 512 / 8 * 1.2
    assert plot.stat().st_size > 0


def test_bench_roofline_small(tmp_path, patched_llama, kernel_library):
    """`bench roofline` on a small shape with a version-1 and a version-2 type on request: beta, gamma of every
    type (ggml's vec_dot for the references, the harness kernel for BITCOS) and the prediction next to the
    measured GEMV of every type and z."""
    out = tmp_path / "roofline.json"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "ggml_bitcos",
            "bench",
            "roofline",
            "--rows",
            "256",
            "--k",
            "512",
            "--z",
            "0.5",
            "--threads",
            "1",
            "--reps",
            "3",
            "--rounds",
            "2",
            "--bitcos-types",
            "bitcos_pt,bitcos_b256",
            "--workdir",
            str(tmp_path / "w"),
            "--json",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:]
    assert "| bitcos_b256 | 0.50 | 1 |" in r.stdout and "| bitcos_pt | 0.50 | 1 |" in r.stdout, r.stdout
    rf = json.loads(out.read_text())
    assert rf["beta_gb_s"]["1"] > 0
    assert set(rf["gamma_cycles_per_32"]) == {"tq2_0", "tq1_0", "q4_0", "bitcos_pt", "bitcos_b256"}
    assert all(g > 0 for g in rf["gamma_cycles_per_32"].values())
    assert {(x["type"], x["z"]) for x in rf["rows"]} == {("tq2_0", None), ("tq1_0", None), ("q4_0", None)} | {
        ("bitcos_pt", 0.5),
        ("bitcos_b256", 0.5),
    }
    for x in rf["rows"]:
        assert len(x["rounds_us"]) == 2 and x["median_us"] > 0
        assert x["predicted_us"] == max(x["t_mem_us"], x["t_ins_us"]) > 0


def test_bench_e2e_tiny_with_decode_breakdown(tmp_path, patched_llama):
    """`bench e2e` on the tiny preset: llama-bench rows for the three models, and the per-token matmul
    breakdown from llama-bitcos-bench decode (ternary weights of the BITCOS file read fewer bytes)."""
    out = tmp_path / "e2e.json"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "ggml_bitcos",
            "bench",
            "e2e",
            "--preset",
            "tiny",
            "--threads",
            "1",
            "--reps",
            "1",
            "--rounds",
            "2",
            "-p",
            "16",
            "-n",
            "8",
            "--breakdown-reps",
            "3",
            "--workdir",
            str(tmp_path / "w"),
            "--json",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:]
    assert "where a generated token's time goes" in r.stdout and "tg ceiling" in r.stdout
    assert_ratios_with_spread(r.stdout)
    # the automatic choice's line, and BITCOS also in both forced CPU forms
    assert re.search(r"BITCOS rows at 1 thread\(s\), the automatic CPU form: (BITCOS|2-bit codes) \(auto:", r.stdout)
    assert "| BITCOS (BITCOS form) |" in r.stdout and "| BITCOS (2-bit form) |" in r.stdout
    data = json.loads(out.read_text())
    assert len(data["llama_bench"]) == 10
    for rec in data["llama_bench"]:
        assert len(rec["rounds_ts"]) == 2 and rec["avg_ts"] > 0
        assert ("vs_TQ2_0" in rec) == (rec["_label"] != "TQ2_0")
    assert all(len(rec["vs_TQ2_0"]["per_round"]) == 2 for rec in data["llama_bench"] if rec["_label"] == "BITCOS")
    bd = {b["model"]: b for b in data["decode_breakdown"]}
    assert set(bd) == {"TQ1_0", "TQ2_0", "BITCOS"}
    for b in bd.values():
        assert b["ternary_us"] > 0 and b["other_us"] > 0 and b["beta_gb_s"] > 0
    # the tiny preset's projections are ternary; BITCOS stores them in fewer bytes than TQ2_0
    assert bd["BITCOS"]["ternary_bytes"] < bd["TQ2_0"]["ternary_bytes"]
    assert bd["BITCOS"]["other_bytes"] == bd["TQ2_0"]["other_bytes"]


# --------------------------------------------------------------------------------------- unit tests
# Tables, JSON and plots on hand-made records: no llama.cpp needed.


def _gemv_results() -> list[dict]:
    base = {"threads": 1, "rows": 256, "k": 512, "file": 0}
    return [
        {**base, "type": "tq2_0", "z": None, "median_us": 10.0, "bytes": 34_000},
        {**base, "type": "tq1_0", "z": None, "median_us": 12.0, "bytes": 28_000},
        {**base, "type": "q4_0", "z": None, "median_us": 15.0, "bytes": 74_000},
        {**base, "type": "bitcos_pt", "z": 0.5, "median_us": 8.0, "bytes": 25_000},
        {**base, "type": "bitcos_pt", "z": 0.0, "median_us": 9.0, "bytes": 33_000},
    ]


def _llama_bench_rows() -> list[dict]:
    rows = []
    for name, tg, pp, size in (
        ("m-z0.42-tq1_0.gguf", 20.0, 200.0, 5 << 20),
        ("m-z0.42-tq2_0.gguf", 25.0, 300.0, 6 << 20),
        ("m-z0.42-bitcos.gguf", 30.0, 280.0, 4 << 20),
    ):
        common = {"model_filename": f"/w/{name}", "n_threads": 1, "stddev_ts": 0.5, "model_size": size}
        rows.append({**common, "n_prompt": 512, "n_gen": 0, "avg_ts": pp})
        rows.append({**common, "n_prompt": 0, "n_gen": 128, "avg_ts": tg, "rounds_ts": [tg, tg]})
    return rows


def _breakdown() -> list[dict]:
    out = []
    for model, tern_us, tern_bytes in (
        ("TQ1_0", 30_000.0, 300e6),
        ("TQ2_0", 25_000.0, 400e6),
        ("BITCOS", 20_000.0, 250e6),
    ):
        out.append(
            {
                "model": model,
                "threads": 1,
                "beta_gb_s": 20.0,
                "ternary_us": tern_us,
                "rounds_ternary_us": [tern_us * 1.01, tern_us],
                "ternary_bytes": tern_bytes,
                "other_us": 5_000.0,
                "other_bytes": 100e6,
            }
        )
    out.append({"model": "BITCOS", "threads": 2, "beta_gb_s": 30.0})  # no tg record, no times: skipped
    return out


def test_tables_and_plots_do_not_mutate_their_inputs(tmp_path):
    """Tables, the e2e JSON and the plots derive labels, tg times and rest times themselves: the records
    passed in are left exactly as they were (so one set of records can feed any of them, in any order)."""
    import copy

    from ggml_bitcos.bench import e2e, gemv, roofline

    gemv_res, rows, breakdown = _gemv_results(), _llama_bench_rows(), _breakdown()
    rf = {
        "beta_gb_s": {1: 20.0},
        "gamma_cycles_per_32": {"tq2_0": 2.5, "bitcos_pt": 2.0},
        "tsc_ghz": 3.0,
        "rows": [
            {**r, "t_mem_us": 5.0, "t_ins_us": 7.0, "predicted_us": 7.0, "bound": "instructions", "gamma": 2.0}
            for r in gemv_res
        ],
    }
    inputs = (gemv_res, rows, breakdown, rf)
    before = copy.deepcopy(inputs)

    gemv_text = gemv.gemv_table(gemv_res)
    roof_text = roofline.roofline_table(rf)
    e2e_text = e2e.e2e_table(rows)
    split_text = e2e.breakdown_table(rows, breakdown)
    data = e2e.e2e_json(rows, breakdown)
    gemv.gemv_plot(gemv_res, tmp_path / "gemv.png", "gemv")
    e2e.e2e_plot(rows, tmp_path / "e2e.png", "e2e")
    assert inputs == before

    assert "| bitcos_pt | 0.50 | 8.0 |" in gemv_text and "1.250x" in gemv_text  # 10 µs / 8 µs vs TQ2_0
    assert "| bitcos_pt | 0.50 | 1 |" in roof_text
    # tg rows in rounds: median (min-max) and per-round ratios; pp rows without rounds: llama-bench's own ±
    assert "| BITCOS | tg128 | 1 | 30.00 (30.00-30.00) | 1.200x (1.200-1.200) | 1.500x (1.500-1.500) |" in e2e_text
    assert "| BITCOS | pp512 | 1 | 280.00 ± 0.50 | 0.933x (1 round) |" in e2e_text
    assert "| TQ2_0 | tg128 | 1 | 25.00 (25.00-25.00) | - | 1.250x (1.250-1.250) |" in e2e_text
    # BITCOS at 1 thread: tg 1000/30 = 33.3 ms, ternary 20 ms, other 5 ms, rest 8.3 ms
    assert "| BITCOS | 1 | 33.3 | 20.0 | 250 | 12.5 | 5.0 | 8.3 |" in split_text
    # per round: ternary matmuls 25.25 / 20.2 ms and 25 / 20 ms; ceiling 40 / (33.3 - 20.2 + 12.5) and
    # 40 / (33.3 - 20 + 12.5) (llama-bench round i with breakdown round i)
    assert "1 thread(s): BITCOS ternary matmuls vs TQ2_0's 1.250x (1.250-1.250); tg ceiling vs TQ2_0 " in split_text
    lo, hi = 40 / (1e3 / 30 - 20 + 12.5), 40 / (1e3 / 30 - 20.2 + 12.5)
    assert f"tg ceiling vs TQ2_0 {(lo + hi) / 2:.3f}x ({lo:.3f}-{hi:.3f}) if they ran at 20.0 GB/s" in split_text
    assert "| BITCOS | 2 |" not in split_text
    # the JSON file keeps the keys it always had: labels on the llama-bench rows, the tg split where known
    assert [r["_label"] for r in data["llama_bench"]] == ["TQ1_0"] * 2 + ["TQ2_0"] * 2 + ["BITCOS"] * 2
    assert [("tg_ms" in b, "rest_ms" in b) for b in data["decode_breakdown"]] == [(True, True)] * 3 + [(False, False)]
    # ... and gain the ratios' spread: BITCOS tg against TQ2_0 per round, none against itself
    assert data["llama_bench"][5]["vs_TQ2_0"]["per_round"] == [1.2, 1.2]
    assert "vs_TQ2_0" not in data["llama_bench"][3] and data["llama_bench"][3]["vs_TQ1_0"]["median"] == 1.25
    assert (tmp_path / "gemv.png").stat().st_size > 0 and (tmp_path / "e2e.png").stat().st_size > 0


def test_bench_gpu_common_quant_references(tmp_path, patched_llama):
    """`bench gpu --refs q4_0,q8_0`: the references of a backend without TQ2_0 (ggml-cuda), here on the CPU
    backend device: one record per reference and per BITCOS z, each with its bytes (Q8_0: 34 per 32 weights,
    Q4_0: 18) and a result, and a ratio column per reference."""
    out = tmp_path / "gpu.json"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "ggml_bitcos",
            "bench",
            "gpu",
            "--device",
            "CPU",
            "--refs",
            "q4_0,q8_0",
            "--shapes",
            "128x512",
            "--z",
            "0.4",
            "--reps",
            "2",
            "--rounds",
            "2",
            "--copy-mib",
            "8",
            "--no-e2e",
            "--workdir",
            str(tmp_path / "w"),
            "--json",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:]
    assert "| vs Q4_0 | vs Q8_0 |" in r.stdout and "| bitcos | 0.40 |" in r.stdout, r.stdout
    assert_ratios_with_spread(r.stdout)
    data = json.loads(out.read_text())
    recs = {(x["type"], x["z"]): x for x in data["matvec"]}
    assert all(len(x["rounds_us"]) == 2 for x in recs.values())
    spread = {(x["type"], x["ref"]): x for x in data["matvec_ratios"]}
    assert {("bitcos", "q4_0"), ("bitcos", "q8_0"), ("q4_0", "q8_0")} <= set(spread)
    assert len(spread[("bitcos", "q4_0")]["per_round"]) == 2
    assert set(recs) == {("q4_0", None), ("q8_0", None), ("bitcos", 0.4)}
    assert (recs[("q8_0", None)]["bytes"], recs[("q4_0", None)]["bytes"]) == (
        128 * 512 // 32 * 34,
        128 * 512 // 32 * 18,
    )
    assert all(x["median_us"] > 0 and x["checksum"] != 0 for x in recs.values())


def test_bench_cli_options():
    """`bench gemv|roofline|e2e` parse their comma lists and point at their module's handler."""
    from ggml_bitcos import cli
    from ggml_bitcos.bench import e2e, gemv, gpu, roofline

    parser = cli.build_parser()
    args = parser.parse_args(["bench", "gemv", "--z", "0,0.5,", "--threads", "1,4", "--order", "grouped"])
    assert (args.func, args.z, args.threads, args.order) == (gemv.run, [0.0, 0.5], [1, 4], "grouped")
    args = parser.parse_args(["bench", "roofline", "--z", "0.4"])
    assert (args.func, args.z, args.reps) == (roofline.run, [0.4], 7)
    # --bitcos-types: one parser for the GEMV benchmarks, default what `convert` writes, v1 on request
    for bench in ("gemv", "roofline", "bandwidth", "batched"):
        assert parser.parse_args(["bench", bench]).bitcos_types == ["bitcos_matrix", "bitcos_b256"]
        args = parser.parse_args(["bench", bench, "--bitcos-types", "bitcos_pt, bitcos_g128,bitcos_pt"])
        assert args.bitcos_types == ["bitcos_pt", "bitcos_g128"]
        for bad in ("tq2_0", "bitcos_b512", ","):
            with pytest.raises(SystemExit):
                parser.parse_args(["bench", bench, "--bitcos-types", bad])
    args = parser.parse_args(["bench", "e2e", "--preset", "tiny", "--no-breakdown"])
    assert (args.func, args.preset, args.no_breakdown, args.rounds) == (e2e.run, "tiny", True, 3)
    args = parser.parse_args(["bench", "gpu", "--device", "CUDA0", "--refs", "Q4_0,q8_0", "--e2e-types", "bitcos"])
    assert (args.func, args.refs, args.e2e_types) == (gpu.run, ["q4_0", "q8_0"], ["bitcos"])
    assert parser.parse_args(["bench", "gpu"]).refs == ["tq2_0"]
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "gpu", "--refs", "q4_k"])


def test_bench_kernels_small(kernel_library):
    """`bench kernels` on a tiny L1 shape: every implementation the CPU has agrees with the generic one
    (measure() refuses to time a wrong kernel) and gets a positive time. The fixture builds the harness
    library into the checkout when it is not installed, as the kernel tests do."""
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "ggml_bitcos",
            "bench",
            "kernels",
            "--rows",
            "4",
            "--k",
            "256",
            "--nc",
            "1,2",
            "--z",
            "0.4",
            "--reps",
            "20",
            "--rounds",
            "2",
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert r.returncode == 0, r.stdout[-3000:]
    timings = json.loads(r.stdout)
    assert {t["nc"] for t in timings} == {1, 2} and all(t["variant"] == "g128" for t in timings)
    assert all(t["cycles_per_32_min"] > 0 for t in timings)
    assert all(len(t["rounds_median"]) == len(t["rounds_min"]) == 2 for t in timings)
    assert all(t["cycles_per_32_min"] == min(t["rounds_min"]) for t in timings)


def test_bench_kernels_variants(kernel_library):
    """`bench kernels --variant` takes the version-2 variants (a comma list, any case) next to g128 / pt, times
    a row length with a partial last unit for the row-scaled ones, and refuses a length a variant does not
    allow, naming it."""
    root = Path(__file__).resolve().parent.parent
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "ggml_bitcos",
            "bench",
            "kernels",
            "--rows",
            "3",
            "--k",
            "160",
            "--variant",
            "MATRIX,row",
            "--nc",
            "1,3",
            "--z",
            "0.4",
            "--reps",
            "5",
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
        cwd=root,
    )
    assert r.returncode == 0, r.stdout[-3000:]
    timings = json.loads(r.stdout)
    assert {(t["variant"], t["nc"]) for t in timings} >= {("matrix", 1), ("row", 3)}
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "ggml_bitcos",
            "bench",
            "kernels",
            "--rows",
            "2",
            "--k",
            "512",
            "--variant",
            "b256,b128,pt",
            "--nc",
            "1",
            "--z",
            "0.4",
            "--reps",
            "5",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
        cwd=root,
    )
    assert r.returncode == 0, r.stdout[-3000:]
    assert "B256 (format version 2)" in r.stdout and "PT (format version 1)" in r.stdout
    # every implementation is timed against generic: the speed-ups with their spread over the 3 default rounds
    assert "over 3 rounds" in r.stdout and "speedup vs generic (min-max over rounds)" in r.stdout
    assert_ratios_with_spread(r.stdout)
    r = subprocess.run(
        [sys.executable, "-m", "ggml_bitcos", "bench", "kernels", "--k", "384", "--variant", "b256"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
        cwd=root,
    )
    assert r.returncode == 2 and "multiple of 256" in r.stdout and "b256" in r.stdout


def test_traffic_generator_modes(kernel_library):
    """bitcos_h_traffic (the generator `bench bandwidth` runs on the other CPUs) does what each mode says on
    its first 256 KiB slice (seconds = 0: exactly one slice): read sums the words it should, write stores,
    copy copies the first half into the second; bad arguments are refused."""
    import ctypes

    import numpy as np

    from ggml_bitcos.bench import traffic

    lib = traffic.traffic_lib()
    slice_bytes = 256 * 1024
    rng = np.random.default_rng(5)
    buf = rng.integers(0, 256, 4 * slice_bytes, dtype=np.uint8)
    moved, checksum = ctypes.c_uint64(0), ctypes.c_uint64(0)

    def call(mode: str, b: np.ndarray, rate: float = 0.0) -> float:
        return lib.bitcos_h_traffic(
            traffic.TRAFFIC_MODES[mode],
            b.ctypes.data,
            b.nbytes,
            rate,
            0.0,
            ctypes.byref(moved),
            ctypes.byref(checksum),
        )

    assert call("read", buf) >= 0 and moved.value == slice_bytes
    words = buf[:slice_bytes].view("<u8").reshape(-1, 8)
    lanes = [int(x) for x in words.sum(axis=0, dtype=np.uint64)]
    expect = 0
    for x in lanes:
        expect ^= x
    assert checksum.value == expect ^ int(buf[-1])

    before = buf.copy()
    assert call("copy", buf) >= 0 and moved.value == 2 * slice_bytes
    half = buf.nbytes // 2
    assert np.array_equal(buf[half : half + slice_bytes], before[:slice_bytes])
    assert np.array_equal(buf[half + slice_bytes :], before[half + slice_bytes :])  # only one slice

    assert call("write", buf) >= 0 and moved.value == slice_bytes
    assert not buf[:slice_bytes].any() and np.array_equal(buf[slice_bytes:half], before[slice_bytes:half])

    assert (
        lib.bitcos_h_traffic(7, buf.ctypes.data, buf.nbytes, 0.0, 0.0, ctypes.byref(moved), ctypes.byref(checksum))
        == -1
    )
    assert call("read", buf[:slice_bytes]) == -1  # smaller than two slices


def test_bandwidth_roofline_prediction_and_crossover():
    """The roofline of `bench bandwidth`: at low bandwidth both GEMVs stream, so the predicted speed ratio is
    the byte ratio; at high bandwidth both execute, so it is the gamma ratio; they cross where the TQ2_0
    bytes take as long at beta as BITCOS takes to execute (beta* = bytes_TQ2_0 / t_ins_BITCOS)."""
    from ggml_bitcos.bench import bandwidth

    n = 16384 * 16384
    rec = {
        "gemv": {"tq2_0": {"weights": n, "bytes": n * 2.0625 / 8}, "bitcos_pt": {"weights": n, "bytes": n * 1.6 / 8}}
    }
    gam, ghz = {"tq2_0": 1.4, "bitcos_pt": 1.8}, 2.6
    low = bandwidth.predicted_ratio(rec, "bitcos_pt", "tq2_0", gam, 0.5, ghz)
    high = bandwidth.predicted_ratio(rec, "bitcos_pt", "tq2_0", gam, 500.0, ghz)
    assert abs(low - 2.0625 / 1.6) < 1e-9 and abs(high - 1.4 / 1.8) < 1e-9
    t_ins_bitcos_us = n / 32 * 1.8 / (ghz * 1e3)
    expect = rec["gemv"]["tq2_0"]["bytes"] / (t_ins_bitcos_us * 1e3)  # GB/s
    got = bandwidth.crossover_beta(rec, "bitcos_pt", "tq2_0", gam, ghz)
    assert got is not None and abs(got / expect - 1) < 0.01
    # a BITCOS kernel faster than TQ2_0 in L1 wins at every bandwidth: no crossover inside the range
    assert bandwidth.crossover_beta(rec, "bitcos_pt", "tq2_0", {"tq2_0": 1.4, "bitcos_pt": 1.2}, ghz) is None


def test_bandwidth_levels_parse():
    """MODE[:RATE][*COUNT] levels; a count beyond the other CPUs or an unknown mode is refused."""
    import argparse

    import pytest

    from ggml_bitcos.bench.traffic import Level, parse_level

    assert parse_level("none", 3) == Level("none")
    assert parse_level("copy", 3) == Level("copy", 0.0, 3)
    assert parse_level("read:2.5*2", 3) == Level("read", 2.5, 2)
    assert parse_level("read:2.5*2", 3).label == "read:2.5*2"
    for bad in ("copy*4", "stream", "read*0"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_level(bad, 3)


def test_bench_bandwidth_small(tmp_path, patched_llama, kernel_library):
    """`bench bandwidth` end to end on a small shape: one level without traffic, one with a paced read
    generator on the second CPU; every level has its beta, the generator's measured traffic and the GEMV
    of every type (ratios are printed, never asserted)."""
    import os

    import pytest

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs")
    out, plot = tmp_path / "bw.json", tmp_path / "bw.png"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "ggml_bitcos",
            "bench",
            "bandwidth",
            "--rows",
            "256",
            "--k",
            "512",
            "--levels",
            "none,read:1*1",
            "--reps",
            "3",
            "--rounds",
            "2",
            "--workdir",
            str(tmp_path / "w"),
            "--json",
            str(out),
            "--plot",
            str(plot),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert r.returncode == 0, r.stdout[-3000:]
    assert "MATRIX/TQ2_0 measured" in r.stdout and "B256/TQ2_0" in r.stdout and "predicted crossover" in r.stdout
    assert RATIO_WITH_SPREAD.search(r.stdout), r.stdout  # (the roofline's predicted ratios stand alone)
    res = json.loads(out.read_text())
    assert res["bitcos_types"] == ["bitcos_matrix", "bitcos_b256"]  # the default: what `convert` writes
    assert {"bitcos_matrix", "bitcos_b256"} <= set(res["gamma"]) and set(res["crossover_gb_s"]) == set(
        res["bitcos_types"]
    )
    assert [lv["level"] for lv in res["levels"]] == ["none", "read:1*1"]
    none, read = res["levels"]
    assert none["generators"] == [] and len(read["generators"]) == 1 and read["generators"][0]["gb_per_s"] > 0
    for lv in res["levels"]:
        assert lv["beta_gb_s"] > 0
        assert set(lv["gemv"]) == {"tq2_0", "tq1_0", "bitcos_matrix", "bitcos_b256"}
        assert all(v["median_us"] > 0 and len(v["rounds_us"]) == 2 for v in lv["gemv"].values())
        assert set(lv["predicted"]) == {"bitcos_matrix", "bitcos_b256"}
        assert set(lv["ratios"]) == {"matrix_vs_tq2_0", "b256_vs_tq2_0", "matrix_vs_tq1_0"}  # no --models: no tg
        assert all(x["rounds"] == 2 for x in lv["ratios"].values())
        # the in-memory form ggml-cpu's rule (csrc/bitcos-form.h) picks at this level's beta
        assert lv["form_choice"]["form"] in ("bitcos", "codes") and lv["form_choice"]["t_codes"] > 0
    assert res["form_gamma"]["bitcos_ns"] > 0 and res["form_gamma"]["codes_ns"] > 0
    assert r.stdout.count("choice: ") == 2, r.stdout
    assert plot.stat().st_size > 0


def test_bench_batched_tiny(tmp_path, patched_llama):
    """`bench batched` on the tiny preset: the MUL_MAT column sweep has every type at every column count, and
    llama-server generated every requested token for P concurrent sequences of every model (speeds printed,
    never asserted)."""
    out = tmp_path / "batched.json"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "ggml_bitcos",
            "bench",
            "batched",
            "--preset",
            "tiny",
            "--parallel",
            "1,3",
            "--threads",
            "1",
            "--n-gen",
            "6",
            "--rounds",
            "2",
            "--gemm-rows",
            "256",
            "--gemm-k",
            "512",
            "--gemm-reps",
            "3",
            "--workdir",
            str(tmp_path / "w"),
            "--json",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:]
    res = json.loads(out.read_text())
    assert {(g["type"], g["ncols"]) for g in res["gemm"]} == {
        (t, n) for t in ("tq2_0", "tq1_0", "bitcos_matrix", "bitcos_b256") for n in (1, 3)
    }
    assert {(s["type"], s["parallel"]) for s in res["server"]} == {
        (t, p) for t in ("tq1_0", "tq2_0", "bitcos") for p in (1, 3)
    }
    assert all(s["agg_ts"] > 0 and s["tokens"] == [6 * s["parallel"]] * 2 for s in res["server"])
    assert all(len(g["rounds_us"]) == 2 for g in res["gemm"]) and all(len(s["rounds_ts"]) == 2 for s in res["server"])
    views = {(x["view"], x.get("type"), x["ref"]) for x in res["ratios"]}
    assert views == {("gemm", t, ref) for t in ("bitcos_matrix", "bitcos_b256") for ref in ("tq2_0", "tq1_0")} | {
        ("server", None, ref) for ref in ("tq2_0", "tq1_0")
    }
    assert all(len(x["per_round"]) == 2 for x in res["ratios"])
    assert "BITCOS_B256/TQ1_0" in r.stdout and "BITCOS/TQ2_0" in r.stdout
    assert_ratios_with_spread(r.stdout)
