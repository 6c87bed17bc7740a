"""README command 1 (`ggml-bitcos demo`) works offline and shows identical output next to TQ2_0, and its
speed ratios come with their spread over interleaved rounds (or "within noise" in words)."""

from __future__ import annotations

import re
import subprocess
import sys

# "tg16: BITCOS / TQ2_0 = 1.012x (per-round range 0.990-1.030 over 3 rounds)" or
# "tg16: BITCOS / TQ2_0: no measurable difference: 1.012x, per-round range 0.900-1.130 over 3 rounds, within noise"
RATIO_LINE = re.compile(
    r"(tg16|pp128): BITCOS / TQ2_0( = \d+\.\d{3}x \(per-round range \d+\.\d{3}-\d+\.\d{3} over 3 rounds\)"
    r"|: no measurable difference: \d+\.\d{3}x, per-round range \d+\.\d{3}-\d+\.\d{3} over 3 rounds, within noise)$",
    re.MULTILINE,
)


def test_demo_runs(tmp_path, patched_llama):
    r = subprocess.run(
        [sys.executable, "-m", "ggml_bitcos", "demo", "--workdir", str(tmp_path), "-n", "16", "--rounds", "3"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=1800,
    )
    assert r.returncode == 0, r.stdout[-4000:]
    assert "identical tokens: yes" in r.stdout
    assert "bits/weight" in r.stdout and "3 rounds alternating the two files" in r.stdout
    assert {m.group(1) for m in RATIO_LINE.finditer(r.stdout)} == {"tg16", "pp128"}, r.stdout[-3000:]
    assert r.stdout.count("tokens/s (median, min-max over rounds)") == 4
