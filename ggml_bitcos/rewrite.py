"""The one safe rewrite of a GGUF file that ``convert`` and ``convert --to`` share: the paths checked, the output
written tensor by tensor through ``gguf_tools.GGUFStreamWriter`` into a temporary file (docs/USAGE.md §3),
verified there against the source, and only then renamed onto the target; any failure removes the temporary
file and becomes one ``ConvertError`` line naming the file.

Each direction says what to write (``OutputTensor``: copied from a source tensor, or bytes it produces) and how
a rewritten tensor is checked (``verify_rewrite``'s per-tensor callbacks); copied tensors are compared byte for
byte here.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf.gguf_reader import ReaderTensor
from tqdm import tqdm

from gguf_tools import CheckedGGUFReader, GGUFError, GGUFStreamWriter, open_gguf, tensor_bytes


class ConvertError(Exception):
    """A conversion failure; ``str()`` is one line naming the file (and tensor) and the problem."""


def check_paths(src: Path, out: Path, force: bool) -> None:
    if not src.exists():
        raise ConvertError(f"{src}: no such file")
    same = out.resolve() == src.resolve() or (out.exists() and os.path.samefile(out, src))
    if same:
        raise ConvertError(f"{out}: output path is the input file; choose another -o")
    if out.exists() and not force:
        raise ConvertError(f"{out}: output already exists (use --force to overwrite)")
    if out.exists() and not out.is_file():
        raise ConvertError(f"{out}: output exists and is not a regular file")
    if not out.parent.is_dir():
        raise ConvertError(f"{out}: output folder {out.parent} does not exist")


@dataclass
class OutputTensor:
    """One tensor of the output, in file order: copied byte for byte from ``source`` (``data`` None), or the
    bytes ``data()`` returns (called once, when the tensor is written)."""

    name: str
    ggml_type: Any
    ne: tuple[int, ...]
    source: ReaderTensor | None = None
    data: Callable[[], np.ndarray] | None = None
    progress_bytes: int = 0  # how far the write bar advances after this tensor


def write_verified(
    reader: CheckedGGUFReader,
    src: Path,
    out: Path,
    *,
    force: bool,
    metadata: Sequence[tuple[str, Any, Any, Any] | ValueError],
    tensors: Sequence[OutputTensor],
    verify: Callable[[Path], None] | None,
    progress: bool,
    seconds: dict[str, float],
) -> list[Path]:
    """Write ``metadata`` (key, value, type, item type; a ValueError for a key that cannot be copied) and
    ``tensors`` to ``out`` through a temporary file, run ``verify(temporary path)`` unless None, then rename it
    onto ``out``. Returns the stale temporary files of killed runs that the writer removed; ``seconds`` gets
    "write" and "verify"."""
    t1 = time.perf_counter()
    arch_field = reader.get_field("general.architecture")
    writer = GGUFStreamWriter(out, arch_field.contents() if arch_field is not None else "", overwrite=force)
    with aborted_on_failure(writer, out):
        for kv in metadata:
            if isinstance(kv, ValueError):
                raise ConvertError(f"{src}: {kv}")
            writer.add_kv(*kv)
        for t in tensors:
            writer.add_tensor_info(t.name, t.ggml_type, t.ne)
        writer.begin()
        bar = tqdm(
            total=sum(t.progress_bytes for t in tensors),
            desc="write",
            unit="B",
            unit_scale=True,
            disable=None if progress else True,
        )  # None: off unless stderr is a terminal
        for t in tensors:
            if t.data is None:
                assert t.source is not None
                writer.write_tensor(t.name, tensor_bytes(t.source), release=reader.release_pages)
            else:
                writer.write_tensor(t.name, t.data())
            reader.release_pages()
            if t.progress_bytes:
                bar.set_postfix_str(t.name, refresh=False)
                bar.update(t.progress_bytes)
        bar.close()
        tmp_path = writer.flush()
        seconds["write"] = time.perf_counter() - t1
        if verify is not None:  # the temporary file, before it replaces anything
            t2 = time.perf_counter()
            assert tmp_path is not None
            verify(tmp_path)
            seconds["verify"] = time.perf_counter() - t2
        writer.finish()
    return writer.removed_stale


def verify_rewrite(
    src_reader: CheckedGGUFReader,
    out_path: Path,
    label: str,
    *,
    rewritten: dict[str, Callable[[ReaderTensor, ReaderTensor, dict[str, ReaderTensor]], None]],
    dropped: frozenset[str] = frozenset(),
    progress: bool = False,
) -> None:
    """Reopen the output and check every source tensor: one in ``dropped`` must be absent; one in
    ``rewritten`` is checked by its callback (source tensor, output tensor, all output tensors by name), which
    raises ConvertError; every other one must be present with the same type and bytes."""
    try:
        out_reader = open_gguf(out_path)
    except GGUFError as e:
        raise ConvertError(f"{label}: verification failed: output does not parse: {e.problem}") from None
    out_reader.drop_array_fields()  # the metadata is not compared here; its parsed arrays only cost memory
    out_tensors = {t.name: t for t in out_reader.tensors}
    bar = tqdm(
        total=sum(int(t.n_bytes) for t in src_reader.tensors),
        desc="verify",
        unit="B",
        unit_scale=True,
        disable=None if progress else True,
    )
    for t in src_reader.tensors:
        o = out_tensors.get(t.name)
        if t.name in dropped:
            if o is not None:
                raise ConvertError(f"{label}: tensor '{t.name}': verification failed: companion left in the output")
        elif o is None:
            raise ConvertError(f"{label}: tensor '{t.name}': verification failed: missing from the output")
        elif t.name in rewritten:
            rewritten[t.name](t, o, out_tensors)
        elif o.tensor_type != t.tensor_type or not bytes_equal(
            tensor_bytes(o), tensor_bytes(t), release=release_pages_of(src_reader, out_reader)
        ):
            raise ConvertError(f"{label}: tensor '{t.name}': verification failed: copied tensor differs")
        src_reader.release_pages()
        out_reader.release_pages()
        bar.set_postfix_str(t.name, refresh=False)
        bar.update(int(t.n_bytes))
    bar.close()
    del out_reader


def size_line(src: Path, out: Path, verified: bool, verified_words: str = "verified bit-exact") -> str:
    """The summary line of a rewrite: both files' sizes and what the verification established."""
    size_in = src.stat().st_size
    size_out = out.stat().st_size if out.exists() else 0
    return f"{src} ({size_in / 1e6:.1f} MB) -> {out} ({size_out / 1e6:.1f} MB)" + (
        f", {verified_words}" if verified else ", not verified (--no-verify)"
    )


def stale_line(removed: Sequence[Path], out: Path) -> str:
    """The summary line on the temporary files of killed runs (of any output) that the writer removed from the
    output's folder (``GGUFStreamWriter.removed_stale``)."""
    return f"removed {len(removed)} stale temporary file(s) left in {out.parent} by killed runs: " + ", ".join(
        p.name for p in removed
    )


@contextlib.contextmanager
def aborted_on_failure(writer: GGUFStreamWriter, out: Path) -> Iterator[None]:
    """Runs the block that writes `out` through `writer` (convert and convert --to): when it fails, the
    writer's temporary file is removed, so nothing partial stays behind, and an OS error becomes a
    ConvertError naming the output and the reason."""
    try:
        yield
    except OSError as e:
        writer.abort()
        raise ConvertError(f"{out}: write failed: {describe_write_error(e, out.parent)}") from None
    except BaseException:
        writer.abort()
        raise


def describe_write_error(e: OSError, folder: Path) -> str:
    """The OS reason of a failed write. numpy's ``tofile`` reports a short write without an errno
    ("N requested and M written"); a full file system is then the likely cause, so say so when the
    target file system has no space left."""
    if e.errno:
        return os.strerror(e.errno)
    try:
        st = os.statvfs(folder)
        if st.f_bavail * st.f_frsize < (1 << 20):
            return f"{os.strerror(errno.ENOSPC)} ({e})"
    except OSError:
        pass
    return str(e)


def bytes_equal(a: np.ndarray, b: np.ndarray, chunk: int = 1 << 24, release: Callable[[], None] | None = None) -> bool:
    """``np.array_equal`` of two flat uint8 arrays in chunks (no temporary as large as the tensor);
    ``release`` is called after each chunk (to drop the mapped pages compared so far)."""
    if a.shape != b.shape:
        return False
    for i in range(0, a.shape[0], chunk):
        same = np.array_equal(a[i : i + chunk], b[i : i + chunk])
        if release is not None:
            release()
        if not same:
            return False
    return True


def release_pages_of(*readers: CheckedGGUFReader) -> Callable[[], None]:
    def release() -> None:
        for r in readers:
            r.release_pages()

    return release


__all__ = [
    "ConvertError",
    "check_paths",
    "OutputTensor",
    "write_verified",
    "verify_rewrite",
    "size_line",
    "stale_line",
    "aborted_on_failure",
    "describe_write_error",
    "bytes_equal",
    "release_pages_of",
]
