"""Console-script wrappers for the tools of the patched llama-cpp-python build (llama_cpp/bin).

`llama-cli`, `llama-completion`, `llama-server`, `llama-bench`, `llama-perplexity` and the RPC server (`rpc-server`,
built as ggml-rpc-server) are installed into the llama_cpp package that `pip install .` puts next to ggml_bitcos
(or `ggml-bitcos build-llama`; the tool-install patch). These wrappers find them without importing llama_cpp (which
would load libllama into this process first) and replace the Python process with the tool.

This module is also where every entry point (the wrappers, ggml_bitcos.llama_run's helpers, `ggml-bitcos demo` and
`bench`) learns whether the llama_cpp Python finds is the BITCOS build and, when it is not (a stock llama-cpp-python
installed over it, or none), what exactly to run: `require_patched()` / `not_patched_message()`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import sys
from pathlib import Path

TOOLS = ("llama-cli", "llama-completion", "llama-server", "llama-bench", "llama-perplexity")
# llama.cpp's RPC server (tools/rpc; its target is ggml-rpc-server), exposed as the console script rpc-server
RPC_SERVER = "ggml-rpc-server"


# version label of the patched llama_cpp package (the version patch: __version__ = "0.3.36+bitcos1")
PATCHED_VERSION_SUFFIX = "+bitcos1"
# how the bundled llama_cpp was built (CMAKE_ARGS): written by the build backend into ggml_bitcos/ of the wheel
BUILD_INFO = Path(__file__).resolve().parent / "llama_build.json"
_VERSION_RE = re.compile(r"""^__version__\s*=\s*["']([^"']+)["']""", re.M)


class ToolNotBuiltError(RuntimeError):
    pass


def llama_cpp_dir() -> Path | None:
    """Directory of the installed llama_cpp package, or None when it is not installed."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def llama_cpp_version(pkg: Path | None = None) -> str | None:
    """__version__ of the llama_cpp package (read from its __init__.py, nothing imported), or None."""
    pkg = pkg if pkg is not None else llama_cpp_dir()
    if pkg is None:
        return None
    try:
        m = _VERSION_RE.search((pkg / "__init__.py").read_text())
    except OSError:
        return None
    return m.group(1) if m else None


def is_patched() -> bool:
    """True when the llama_cpp package Python finds is the BITCOS build (its version carries the +bitcos tag)."""
    version = llama_cpp_version()
    return version is not None and version.endswith(PATCHED_VERSION_SUFFIX)


def _installed_from() -> tuple[str, bool]:
    """(what to pass to pip install for this ggml-bitcos, whether it is installed as a distribution): the checkout
    or unpacked sdist this module runs from, else where pip installed it from (direct_url.json), else the
    release from the index."""
    from importlib import metadata
    from urllib.parse import unquote, urlparse

    root = Path(__file__).resolve().parent.parent
    try:
        dist = metadata.distribution("ggml-bitcos")
    except metadata.PackageNotFoundError:
        dist = None
    if (root / "pyproject.toml").is_file() and (root / "buildsys").is_dir():
        return str(root), dist is not None
    if dist is None:
        return "ggml-bitcos", False
    try:
        direct = json.loads(dist.read_text("direct_url.json") or "{}")
    except ValueError:
        direct = {}
    url = direct.get("url", "")
    if url.startswith("file://"):
        return unquote(urlparse(url).path), True
    if url and "vcs_info" in direct:
        vcs = direct["vcs_info"]
        return f"{vcs.get('vcs', 'git')}+{url}@{vcs.get('commit_id', '')}".rstrip("@"), True
    if url:
        return url, True
    return f"ggml-bitcos=={dist.version}", True


def _build_info() -> dict:
    """llama_build.json of the installed wheel: next to this module, or (editable install) in another folder
    of the ggml_bitcos package's path; {} when there is none (a checkout)."""
    import ggml_bitcos

    for folder in [BUILD_INFO.parent, *map(Path, getattr(ggml_bitcos, "__path__", []))]:
        try:
            return json.loads((folder / BUILD_INFO.name).read_text())
        except (OSError, ValueError):
            continue
    return {}


def _cmake_args() -> str:
    """CMAKE_ARGS of the build this package shipped with (llama_build.json), else of this environment."""
    info = _build_info()
    if "user_cmake_args" in info:
        return str(info["user_cmake_args"]).strip()
    return os.environ.get("CMAKE_ARGS", "").strip()


def install_commands() -> list[str]:
    """The shell commands that put the patched llama_cpp (and its tools) into this Python environment: one
    `pip install` of this project (which builds llama.cpp with the BITCOS patches and ships its llama_cpp),
    after removing a separately installed llama-cpp-python distribution, which owns the same files."""
    from importlib import metadata

    py = shlex.quote(sys.executable)
    cmds = []
    try:
        metadata.distribution("llama-cpp-python")
        cmds.append(f"{py} -m pip uninstall -y llama-cpp-python")
    except metadata.PackageNotFoundError:
        pass
    source, installed = _installed_from()
    cmake_args = _cmake_args()
    env = f"CMAKE_ARGS={shlex.quote(cmake_args)} " if cmake_args else ""
    opts = "--force-reinstall --no-deps " if installed else ""
    cmds.append(f"{env}{py} -m pip install {opts}{shlex.quote(source)}")
    return cmds


def not_patched_message(pkg: Path | None = None) -> str | None:
    """None when the llama_cpp Python finds is the BITCOS build; else what is wrong and exactly what to run."""
    pkg = pkg if pkg is not None else llama_cpp_dir()
    version = llama_cpp_version(pkg)
    if version is not None and version.endswith(PATCHED_VERSION_SUFFIX):
        return None
    if pkg is None:
        what = f"llama_cpp is not installed in this Python ({sys.executable})"
    else:
        what = (
            f"the llama_cpp at {pkg} is {'stock llama-cpp-python ' + version if version else 'not'} "
            f"the BITCOS build of ggml-bitcos (llama-cpp-python 0.3.36{PATCHED_VERSION_SUFFIX}): it cannot "
            f"load BITCOS files"
        )
    return what + ". Install the patched llama.cpp with:\n" + "\n".join("    " + c for c in install_commands())


def require_patched() -> Path:
    """The patched llama_cpp package's directory; raises ToolNotBuiltError with not_patched_message otherwise."""
    pkg = llama_cpp_dir()
    msg = not_patched_message(pkg)
    if msg is not None or pkg is None:
        raise ToolNotBuiltError(msg or "llama_cpp is not installed")
    return pkg


def tool_path(name: str) -> Path:
    """Path of llama_cpp/bin/<name>; raises ToolNotBuiltError saying what to run when llama_cpp is not the
    patched build or lacks the tool."""
    pkg = require_patched()
    exe = pkg / "bin" / (name + (".exe" if os.name == "nt" else ""))
    if not exe.is_file():
        raise ToolNotBuiltError(
            f"{exe} not found: the patched llama_cpp at {pkg} was built without {name} (an "
            "older ggml-bitcos build?). Rebuild it with:\n" + "\n".join("    " + c for c in install_commands())
        )
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
