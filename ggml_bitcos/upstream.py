"""The pinned upstream source: llama-cpp-python's sdist, which vendors llama.cpp.

Fetched from the package index by name with pip (never committed), checked by sha256, cached under
$GGML_BITCOS_CACHE (default ~/.cache/ggml-bitcos).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
from pathlib import Path

SDIST_NAME = "llama-cpp-python"
SDIST_VERSION = "0.3.36"
SDIST_FILE = f"llama_cpp_python-{SDIST_VERSION}.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
LLAMA_CPP_COMMIT = "0c1e570"
SDIST_TOPDIR = f"llama_cpp_python-{SDIST_VERSION}"


class UpstreamError(RuntimeError):
    pass


def cache_dir() -> Path:
    d = Path(os.environ.get("GGML_BITCOS_CACHE", Path.home() / ".cache" / "ggml-bitcos"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sdist_cached() -> bool:
    """Whether the verified sdist is in the cache already (no download needed)."""
    dest = cache_dir() / SDIST_FILE
    return dest.exists() and _sha256(dest) == SDIST_SHA256


def fetch_sdist() -> Path:
    """Return the path of the verified sdist tarball, downloading it with pip if not cached."""
    dest = cache_dir() / SDIST_FILE
    if dest.exists() and _sha256(dest) == SDIST_SHA256:
        return dest
    dest.unlink(missing_ok=True)
    # --no-binary for this one package only (build deps stay wheels); --no-build-isolation avoids
    # building cmake from source just to read the sdist's metadata.
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--no-build-isolation",
        "--no-binary",
        SDIST_NAME,
        f"{SDIST_NAME}=={SDIST_VERSION}",
        "-d",
        str(dest.parent),
    ]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0 or not dest.exists():
        raise UpstreamError(f"could not download {SDIST_NAME}=={SDIST_VERSION} with pip:\n{r.stdout[-2000:]}")
    got = _sha256(dest)
    if got != SDIST_SHA256:
        dest.unlink(missing_ok=True)
        raise UpstreamError(f"{SDIST_FILE}: sha256 {got} != pinned {SDIST_SHA256}")
    return dest


def read_member(relpath: str) -> bytes:
    """Read one file of the vendored tree, e.g. 'vendor/llama.cpp/models/ggml-vocab-llama-spm.gguf'."""
    with tarfile.open(fetch_sdist(), "r:gz") as tf:
        f = tf.extractfile(f"{SDIST_TOPDIR}/{relpath}")
        if f is None:
            raise UpstreamError(f"{relpath} not found in {SDIST_FILE}")
        return f.read()


def vocab_gguf(name: str = "llama-spm") -> Path:
    """Path of a cached vocab-only GGUF from the sdist (real tokenizer for synthetic models)."""
    out = cache_dir() / f"ggml-vocab-{name}.gguf"
    if not out.exists():
        data = read_member(f"vendor/llama.cpp/models/ggml-vocab-{name}.gguf")
        tmp = out.with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.replace(out)
    return out


def extract_sdist(dest: Path) -> Path:
    """Extract the sdist into dest (which must not exist); returns the source root."""
    if dest.exists():
        raise UpstreamError(f"{dest} already exists")
    dest.mkdir(parents=True)
    with tarfile.open(fetch_sdist(), "r:gz") as tf:
        tf.extractall(dest, filter="data")
    return dest / SDIST_TOPDIR
