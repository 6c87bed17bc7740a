"""`ggml-bitcos demo`: the whole product in one offline run.

1. makes the default model — a synthetic ternary llama (hidden 1024, ffn 2816, 8 layers, real llama-spm
   tokenizer, zero density 0.42, BitNet-style per-matrix scales) stored as TQ2_0;
2. converts it to BITCOS (bit-exact, verified);
3. prints file sizes and bits per ternary weight;
4. runs both files through the patched llama.cpp (Python bindings, greedy) and shows the output is
   identical;
5. prints decode and prompt tokens/s of both from llama-bench, in rounds alternating the two files, and the
   ratio with its per-round range ("within noise" when the rounds do not agree on a difference).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from ggml_bitcos import llama_run, llama_tools
from ggml_bitcos.bench import timing
from ggml_bitcos.bench.e2e import llama_bench_rounds
from ggml_bitcos.format import BITCOS_TYPE_IDS, COMPANION_SUFFIX

DEMO_SHAPE = [
    "--preset",
    "tiny",
    "--n-embd",
    "1024",
    "--n-ff",
    "2816",
    "--n-layer",
    "8",
    "--n-head",
    "16",
    "--n-head-kv",
    "8",
    "--embd-type",
    "q8_0",
]
PROMPT = "Once upon a time, in a small river town,"


def _cli(args: list[str]) -> None:
    r = subprocess.run([sys.executable, "-m", "ggml_bitcos", *args])
    if r.returncode != 0:
        raise SystemExit(f"ggml-bitcos demo: `ggml-bitcos {' '.join(args)}` failed ({r.returncode})")


def ternary_weights(path: Path) -> tuple[int, int]:
    """(number of ternary weights, bytes they occupy incl. scales and companions) of a GGUF."""
    from gguf import GGMLQuantizationType

    from gguf_tools import open_gguf

    ternary_types = BITCOS_TYPE_IDS | {GGMLQuantizationType.TQ2_0, GGMLQuantizationType.TQ1_0}
    n = nbytes = 0
    r = open_gguf(path)
    names = {t.name for t in r.tensors}
    for t in r.tensors:
        if t.tensor_type in ternary_types:
            n += int(t.n_elements)
            nbytes += int(t.n_bytes)
        elif t.name.endswith(COMPANION_SUFFIX) and t.name[: -len(COMPANION_SUFFIX)] in names:
            nbytes += int(t.n_bytes)
    return n, nbytes


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "demo",
        help="offline end-to-end demo: make, convert, run, compare with TQ2_0",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--workdir", type=Path, default=Path("bitcos-demo"))
    p.add_argument("--zero-density", type=float, default=0.42)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("-n", "--n-tokens", type=int, default=64)
    timing.add_rounds_argument(p, 5, "llama-bench on both files")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    wd: Path = args.workdir
    wd.mkdir(parents=True, exist_ok=True)
    src = wd / f"demo-z{args.zero_density:.2f}-tq2_0.gguf"
    out = wd / f"demo-z{args.zero_density:.2f}-bitcos.gguf"
    print(f"== 1. default model: {src}")
    if not src.exists():
        _cli(
            [
                "make-model",
                "-o",
                str(src),
                *DEMO_SHAPE,
                "--zero-density",
                str(args.zero_density),
                "--type",
                "tq2_0",
                "--scale",
                "tensor",
                "--seed",
                "1",
                "-q",
            ]
        )
    print(f"== 2. convert to BITCOS: {out}")
    _cli(["convert", str(src), "-o", str(out), "--force"])

    print("== 3. sizes")
    for label, path in (("TQ2_0 ", src), ("BITCOS", out)):
        n, b = ternary_weights(path)
        print(
            f"   {label}  file {path.stat().st_size / 2**20:7.2f} MiB   ternary weights {n / 1e6:6.1f} M   "
            f"{8 * b / n:.4f} bits/weight (incl. scales, index)"
        )
    print(f"   BITCOS formula 2 - z = {2 - args.zero_density:.3f} bits/weight (per-tensor scale variant)")

    if not llama_run.is_patched():
        print(
            f"ggml-bitcos demo: steps 4-5 need the patched llama.cpp: {llama_tools.not_patched_message()}",
            file=sys.stderr,
        )
        return 1
    print(f"== 4. greedy {args.n_tokens} tokens through llama_cpp.Llama (patched llama.cpp)")
    a = llama_run.greedy_generate(src, PROMPT, args.n_tokens, n_threads=args.threads)
    b = llama_run.greedy_generate(out, PROMPT, args.n_tokens, n_threads=args.threads)
    print(f"   prompt: {PROMPT!r}")
    print(f"   TQ2_0 : {a.text!r}")
    print(f"   BITCOS: {b.text!r}")
    same = a.tokens == b.tokens
    diff = float(np.max(np.abs(a.logits - b.logits)))
    print(
        f"   identical tokens: {'yes' if same else 'NO'}; max |logit difference| {diff:.2e} "
        f"(largest logit {float(np.max(np.abs(a.logits))):.2f})"
    )

    print(
        f"== 5. llama-bench (tg{args.n_tokens}, pp128), {args.threads} thread(s), {args.rounds} rounds "
        "alternating the two files"
    )
    rows = llama_bench_rounds([src, out], args.rounds, 1, n_prompt=128, n_gen=args.n_tokens, threads=[args.threads])
    runs = {}
    for r in rows:
        kind = "pp128" if r["n_prompt"] else f"tg{args.n_tokens}"
        label = "BITCOS" if "bitcos" in Path(r["model_filename"]).name else "TQ2_0"
        runs[(label, kind)] = r["rounds_ts"]
        print(f"   {label:6s} {kind:6s} {timing.value_cell(r['rounds_ts'])} tokens/s (median, min-max over rounds)")
    for kind in (f"tg{args.n_tokens}", "pp128"):
        if ("BITCOS", kind) in runs and ("TQ2_0", kind) in runs:
            spread = timing.speed_ratio(runs[("BITCOS", kind)], runs[("TQ2_0", kind)])
            print(f"   {spread.sentence(f'{kind}: BITCOS / TQ2_0')}")
    return 0 if same else 1
