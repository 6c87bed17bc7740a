"""Test-only runs of the patched llama.cpp tools: llama-completion, llama-cli and llama-perplexity, and how
their greedy token sequences are compared.

The product's own runners (greedy generation through the bindings, llama-bench, llama-server) are in
ggml_bitcos.llama_run; these three serve only the tests, so they live here.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence
from pathlib import Path

from ggml_bitcos.llama_run import tool_failure, tool_path


def run_completion(
    model: Path, prompt: str, n_tokens: int = 64, threads: int = 2, timeout: float = 300, extra: list[str] | None = None
) -> str:
    """Greedy completion through the llama-completion tool; returns the generated text (stdout). `extra`:
    more options (e.g. ["--rpc", "127.0.0.1:50052", "-ngl", "99"])."""
    cmd = [
        str(tool_path("llama-completion")),
        "-m",
        str(model),
        "-p",
        prompt,
        "-n",
        str(n_tokens),
        "--temp",
        "0",
        "--top-k",
        "1",
        "--seed",
        "0",
        "-t",
        str(threads),
        "-no-cnv",
        "--no-warmup",
        "--simple-io",
        "-c",
        "512",
        *(extra or []),
    ]
    r = subprocess.run(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )
    if r.returncode != 0:
        raise tool_failure("llama-completion", r.returncode, model, r.stderr)
    return r.stdout


def run_cli(model: Path, prompt: str, n_tokens: int = 64, threads: int = 2, timeout: float = 300) -> str:
    """One single-turn greedy chat reply through llama-cli (-st); returns the reply text only."""
    cmd = [
        str(tool_path("llama-cli")),
        "-m",
        str(model),
        "-p",
        prompt,
        "-n",
        str(n_tokens),
        "--temp",
        "0",
        "--top-k",
        "1",
        "--seed",
        "0",
        "-t",
        str(threads),
        "-st",
        "--no-warmup",
        "-c",
        "512",
    ]
    r = subprocess.run(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )
    if r.returncode != 0:
        raise tool_failure("llama-cli", r.returncode, model, r.stderr)
    # the reply follows the echoed "> prompt" line and ends before the "[ Prompt: … t/s ]" timing line
    out = r.stdout
    start = out.find(f"> {prompt}")
    if start < 0:
        raise RuntimeError(f"llama-cli output has no echoed prompt:\n{out[-2000:]}")
    reply = out[start + len(prompt) + 2 :]
    end = reply.find("\n[ Prompt:")
    return (reply[:end] if end >= 0 else reply).strip()


_PPL_RE = re.compile(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)")


def run_perplexity(
    model: Path,
    text_file: Path,
    ctx: int = 128,
    threads: int = 2,
    timeout: float = 1800,
    extra: list[str] | None = None,
) -> tuple[float, float]:
    """llama-perplexity on a text file; returns (ppl, stderr of ppl). `extra`: more options (e.g. -ngl 99)."""
    cmd = [
        str(tool_path("llama-perplexity")),
        "-m",
        str(model),
        "-f",
        str(text_file),
        "-c",
        str(ctx),
        "-b",
        str(ctx),
        "-t",
        str(threads),
        *(extra or []),
    ]
    r = subprocess.run(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )
    m = _PPL_RE.search(r.stdout)
    if r.returncode != 0 or not m:
        raise tool_failure("llama-perplexity", r.returncode, model, r.stdout)
    return float(m.group(1)), float(m.group(2))


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens two greedy sequences share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
