"""llama-server under load: several slots, more concurrent clients than slots, every request
answered, and a BITCOS model's greedy completions equal to its TQ2_0 source's.

Needs the patched build (skips without it).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ggml_bitcos import llama_run

SLOTS, CLIENTS, N_PREDICT = 4, 8, 24
PROMPTS = [
    "The quick brown fox jumps over the lazy dog. Once upon a time",
    "In a hole in the ground there lived",
    "It was the best of times, it was the worst of times,",
    "Call me Ishmael. Some years ago",
    "All happy families are alike;",
    "The sky above the port was the color of",
    "It is a truth universally acknowledged,",
    "Far out in the uncharted backwaters of",
]
assert len(PROMPTS) == CLIENTS


@pytest.fixture(scope="module")
def pair(model_factory, tmp_path_factory, patched_llama) -> tuple[Path, Path]:
    """A tiny TQ2_0 llama (z = 0.42, fp16 block scales) and its BITCOS conversion."""
    from ggml_bitcos.convert import convert

    src = model_factory(z=0.42, scale="g128", src_type="tq2_0", seed=7)
    out = tmp_path_factory.mktemp("server") / "bitcos.gguf"
    convert(src, out, progress=False)
    return src, out


def serve_concurrently(model: Path) -> tuple[list[str | None], list[str]]:
    """One llama-server with SLOTS slots, CLIENTS clients at once (one request each, greedy, fixed seed):
    (completion text per prompt, None where the request failed; the failures' messages)."""
    texts: list[str | None] = [None] * CLIENTS
    failures: list[str] = []
    with llama_run.LlamaServer(model, threads=2, ctx=SLOTS * 256, extra=["-np", str(SLOTS)]) as srv:
        with ThreadPoolExecutor(CLIENTS) as pool:
            futures = [pool.submit(srv.complete, p, N_PREDICT) for p in PROMPTS]
            for i, f in enumerate(futures):
                try:
                    reply = f.result()
                    texts[i] = reply["content"]
                    assert reply["tokens_predicted"] == N_PREDICT, reply
                except Exception as e:  # noqa: BLE001 (counted and reported)
                    failures.append(f"prompt {i}: {type(e).__name__}: {e}")
        if failures:
            failures.append(srv.log()[-3000:])
    return texts, failures


def test_server_slots_under_concurrent_clients_match_tq2_0(pair) -> None:
    src, out = pair
    ref, ref_fail = serve_concurrently(src)
    got, got_fail = serve_concurrently(out)
    assert not ref_fail, "\n".join(ref_fail)
    assert not got_fail, "\n".join(got_fail)
    assert got == ref
    assert len(set(got)) > 1 and all(t and t.strip() for t in got)  # real, prompt-dependent text
