#!/usr/bin/env python3
"""Build and install the patched llama-cpp-python (same as `ggml-bitcos build-llama`; see ggml_bitcos/build.py).

python scripts/build_llama.py                 # CPU build, -DGGML_NATIVE=ON
CMAKE_ARGS="-DGGML_VULKAN=ON" python scripts/build_llama.py
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ggml_bitcos import build  # noqa: E402

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd")
    build.register(sub)
    argv = sys.argv[1:]
    args = ap.parse_args(["build-llama", *argv])
    sys.exit(args.func(args))
