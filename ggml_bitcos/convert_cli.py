"""``ggml-bitcos convert``: the command line of both directions, ``convert`` (ternary weights to BITCOS:
ggml_bitcos.convert) and ``convert --to`` (BITCOS back to a stock type: ggml_bitcos.convert_back)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .convert import convert, summarize
from .convert_back import KEEP, TARGETS, convert_back, print_summary
from .format import VERSION, VERSIONS
from .passes import DEFAULT_CACHE_BYTES, SCALE_CHOICES, ConvertOptions
from .passes.read import add_i2s_layout_option
from .rewrite import ConvertError


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "convert",
        help="rewrite the ternary weights of a GGUF as BITCOS",
        description="Rewrite every exactly-ternary weight (TQ1_0, TQ2_0, or F16/BF16/F32 "
        "holding ternary values) as BITCOS; copy everything else unchanged.",
    )
    p.add_argument("input", type=Path, metavar="IN.gguf")
    p.add_argument("-o", "--output", type=Path, metavar="OUT.gguf", help="default: IN-bitcos.gguf")
    p.add_argument(
        "--scale",
        choices=SCALE_CHOICES,
        default="auto",
        help="the scale granularity: auto (default) picks, per tensor, the one whose exact form takes "
        "the fewest bytes (ties to the coarser); tensor (one fp32 per matrix), row (fp32 per row), "
        "256 / 128 (fp16 per 256 / 128 weights of a row; g128 = 128) force one, and a tensor it "
        "cannot hold exactly stays unconverted",
    )
    p.add_argument(
        "--format-version",
        type=int,
        choices=VERSIONS,
        default=None,
        help=f"BITCOS format version to write (default {VERSION}); 1 for readers that predate version "
        "2: types BITCOS_PT / BITCOS_G128, rows a multiple of 128, --scale auto|tensor|128",
    )
    p.add_argument(
        "--strict",
        action="store_true",
        help="fail unless every tensor holding ternary weights (TQ1_0/TQ2_0, or F16/BF16/F32 "
        "holding ternary values) ends up BITCOS; lookup tables (token_embd) are exempt",
    )
    p.add_argument(
        "--allow-copy",
        action="store_true",
        help="write the output even when nothing converts (otherwise an error, and no output)",
    )
    p.add_argument(
        "--force-grow",
        action="store_true",
        help="convert tensors whose BITCOS form is larger than the source (e.g. TQ1_0 at low zero "
        "density); by default they stay in their source type and the summary lists them",
    )
    p.add_argument(
        "--to",
        choices=sorted(TARGETS),
        metavar="TYPE",
        help="the other direction: convert the BITCOS weights of IN back to TYPE "
        f"({', '.join(TARGETS)}), bit-exactly; default output IN-TYPE.gguf",
    )
    p.add_argument(
        "--fallback",
        choices=sorted([*TARGETS, KEEP]),
        metavar="TYPE",
        help="with --to: tensors that TYPE cannot hold exactly go to this type instead (f32 always "
        "can; keep: leave them BITCOS); without it such a tensor is an error",
    )
    add_i2s_layout_option(p)
    p.add_argument("--no-verify", action="store_true", help="skip the bit-exact check of the output")
    p.add_argument(
        "--cache-mb",
        type=int,
        default=DEFAULT_CACHE_BYTES >> 20,
        metavar="MB",
        help="encodings kept in memory between the analyze and write passes (default "
        f"{DEFAULT_CACHE_BYTES >> 20}); tensors beyond it are encoded again when written: "
        "larger is faster and adds up to MB to the peak memory",
    )
    p.add_argument("--force", action="store_true", help="overwrite the output if it exists")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar or summary")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.to is not None:
        if (
            args.scale != "auto"
            or args.strict
            or args.allow_copy
            or args.force_grow
            or args.format_version is not None
            or args.i2s_layout is not None
        ):
            raise ConvertError(
                "--to converts BITCOS back; --scale, --format-version, --strict, --allow-copy, "
                "--force-grow and --i2s-layout belong to the forward direction"
            )
        back = convert_back(
            args.input,
            args.output,
            to=args.to,
            fallback=args.fallback,
            verify=not args.no_verify,
            force=args.force,
            progress=not args.quiet,
        )
        if not args.quiet:
            print_summary(back)
        return 0
    if args.fallback is not None:
        raise ConvertError("--fallback applies to --to only")
    if args.cache_mb < 0:
        raise ConvertError("--cache-mb must be >= 0")
    options = ConvertOptions(
        scale=args.scale,
        format_version=VERSION if args.format_version is None else args.format_version,
        strict=args.strict,
        allow_copy=args.allow_copy,
        force_grow=args.force_grow,
        i2s_layout=args.i2s_layout,
        verify=not args.no_verify,
        force=args.force,
        progress=not args.quiet,
        cache_bytes=args.cache_mb << 20,
    )
    res = convert(args.input, args.output, options)
    if not args.quiet:
        for line in summarize(res):
            print(line, file=sys.stderr)
    elif res.layout_assumed:  # an assumption about the input is said even with -q
        for note in res.notes:
            print(f"source: {note}", file=sys.stderr)
    return 0


__all__ = ["register", "run"]
