"""`ggml-bitcos bench gemv` runs every type through ggml's MUL_MAT in one run and prints the ratio table.

A smoke test on a small shape: it checks the measurements exist and are consistent, never their speed.
"""

from __future__ import annotations

import json
import subprocess
import sys


def test_bench_gemv_small(tmp_path, patched_llama):
    out = tmp_path / "gemv.json"
    plot = tmp_path / "gemv.png"
    r = subprocess.run([sys.executable, "-m", "ggml_bitcos", "bench", "gemv", "--rows", "256", "--k", "512",
                        "--z", "0,0.5,1", "--threads", "1", "--reps", "3", "--workdir", str(tmp_path / "w"),
                        "--json", str(out), "--plot", str(plot)],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:]
    assert "vs TQ2_0" in r.stdout and "bitcos_pt" in r.stdout
    res = json.loads(out.read_text())["results"]
    types = {(x["type"], x["z"]) for x in res}
    assert {("tq2_0", None), ("tq1_0", None), ("q4_0", None)} <= types
    assert {("bitcos_pt", 0.0), ("bitcos_g128", 0.5), ("bitcos_pt", 1.0)} <= types
    assert all(x["median_us"] > 0 and x["rows"] == 256 and x["k"] == 512 for x in res)
    # bytes include the companion: BITCOS_PT at z = 1 stores 1 bit per weight plus a small index
    pt1 = next(x for x in res if x["type"] == "bitcos_pt" and x["z"] == 1.0)
    assert 256 * 512 / 8 < pt1["bytes"] < 256 * 512 / 8 * 1.2
    assert plot.stat().st_size > 0


def test_bench_e2e_tiny_with_decode_breakdown(tmp_path, patched_llama):
    """`bench e2e` on the tiny preset: llama-bench rows for the three models, and the per-token matmul
    breakdown from llama-bitcos-bench decode (ternary weights of the BITCOS file read fewer bytes)."""
    out = tmp_path / "e2e.json"
    r = subprocess.run([sys.executable, "-m", "ggml_bitcos", "bench", "e2e", "--preset", "tiny", "--threads", "1",
                        "--reps", "1", "--rounds", "2", "-p", "16", "-n", "8", "--breakdown-reps", "3",
                        "--workdir", str(tmp_path / "w"), "--json", str(out)],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:]
    assert "where a generated token's time goes" in r.stdout and "tg ceiling" in r.stdout
    data = json.loads(out.read_text())
    assert len(data["llama_bench"]) == 6
    bd = {b["model"]: b for b in data["decode_breakdown"]}
    assert set(bd) == {"TQ1_0", "TQ2_0", "BITCOS"}
    for b in bd.values():
        assert b["ternary_us"] > 0 and b["other_us"] > 0 and b["beta_gb_s"] > 0
    # the tiny preset's projections are ternary; BITCOS stores them in fewer bytes than TQ2_0
    assert bd["BITCOS"]["ternary_bytes"] < bd["TQ2_0"]["ternary_bytes"]
    assert bd["BITCOS"]["other_bytes"] == bd["TQ2_0"]["other_bytes"]
