"""README command 1 (`ggml-bitcos demo`) works offline and shows identical output next to TQ2_0."""

from __future__ import annotations

import subprocess
import sys


def test_demo_runs(tmp_path, patched_llama):
    r = subprocess.run(
        [sys.executable, "-m", "ggml_bitcos", "demo", "--workdir", str(tmp_path), "-n", "16"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=1800,
    )
    assert r.returncode == 0, r.stdout[-4000:]
    assert "identical tokens: yes" in r.stdout
    assert "bits/weight" in r.stdout and "BITCOS / TQ2_0" in r.stdout
