"""Console-script wrappers for the tools of the patched llama-cpp-python build (llama_cpp/bin).

`llama-cli`, `llama-completion`, `llama-server`, `llama-bench`, `llama-perplexity` and the RPC server (`rpc-server`,
built as ggml-rpc-server) are installed into the llama_cpp package
by `ggml-bitcos build-llama` (the tool-install patch). These wrappers find them without importing llama_cpp (which
would load libllama into this process first) and replace the Python process with the tool.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

TOOLS = ("llama-cli", "llama-completion", "llama-server", "llama-bench", "llama-perplexity")
# llama.cpp's RPC server (tools/rpc; its target is ggml-rpc-server), exposed as the console script rpc-server
RPC_SERVER = "ggml-rpc-server"


class ToolNotBuiltError(RuntimeError):
    pass


def llama_cpp_dir() -> Path | None:
    """Directory of the installed llama_cpp package, or None when it is not installed."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def tool_path(name: str) -> Path:
    """Path of llama_cpp/bin/<name>; raises ToolNotBuiltError with a hint when missing."""
    pkg = llama_cpp_dir()
    if pkg is None:
        raise ToolNotBuiltError("llama_cpp is not installed; run `ggml-bitcos build-llama` to build the patched "
                                "llama-cpp-python with its tools")
    exe = pkg / "bin" / (name + (".exe" if os.name == "nt" else ""))
    if not exe.is_file():
        raise ToolNotBuiltError(f"{exe} not found: the installed llama-cpp-python ({pkg}) is not the build from "
                                f"`ggml-bitcos build-llama`; run it to build the patched tools")
    return exe


def _exec(name: str) -> None:
    try:
        exe = tool_path(name)
    except ToolNotBuiltError as e:
        print(f"{name}: {e}", file=sys.stderr)
        sys.exit(1)
    os.execv(str(exe), [str(exe), *sys.argv[1:]])


def llama_cli() -> None:
    _exec("llama-cli")


def llama_completion() -> None:
    _exec("llama-completion")


def llama_server() -> None:
    _exec("llama-server")


def llama_bench() -> None:
    _exec("llama-bench")


def llama_perplexity() -> None:
    _exec("llama-perplexity")


def rpc_server() -> None:
    _exec(RPC_SERVER)
