"""``ggml-bitcos`` command line: one subcommand per module.

To add a subcommand, add its module name to ``SUBCOMMAND_MODULES``; the module exposes
``register(subparsers)``, which adds a parser and sets ``func`` (``args -> exit code``) as a default.
Modules are imported lazily only when building the parser, so a missing optional module (e.g. one that
needs the patched llama.cpp) is skipped with a note instead of breaking every other subcommand.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from . import __version__

SUBCOMMAND_MODULES: list[str] = [
    "ggml_bitcos.convert_cli",
    "ggml_bitcos.stats",
    "ggml_bitcos.info",
    "ggml_bitcos.make_model",
    "ggml_bitcos.ternarize",
    "ggml_bitcos.demo",
    "ggml_bitcos.bench",
    "ggml_bitcos.build",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ggml-bitcos",
        description="BITCOS ternary weights (presence bitmap + compacted signs) for llama.cpp / GGUF",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError as e:  # an optional subcommand whose dependencies are missing
            print(f"ggml-bitcos: note: subcommand module {name} unavailable ({e})", file=sys.stderr)
            continue
        module.register(sub)
    return parser


def _error_types() -> tuple[type[BaseException], ...]:
    from gguf_tools import GGUFError

    from .codec import FormatError
    from .convert import ConvertError
    from .llama_tools import ToolNotBuiltError  # the patched llama.cpp is missing: the message says what to run

    return (GGUFError, ConvertError, FormatError, ToolNotBuiltError)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    known = _error_types()
    try:
        return int(args.func(args) or 0)
    except known as e:
        print(f"ggml-bitcos: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        where = f"{e.filename}: " if e.filename else ""
        print(f"ggml-bitcos: error: {where}{e.strerror or e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("ggml-bitcos: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
