"""Streaming GGUF writing on top of gguf-py's ``GGUFWriter``, with bounded memory and atomic output.

``GGUFWriter``'s usual flow (``add_tensor`` for every tensor, then ``write_tensors_to_file``) keeps every
tensor referenced until the end. Its lower-level API streams instead: declare all tensor infos first
(``add_tensor_info``: name, shape, type, byte size), write header + metadata + tensor infos, then hand it
the tensor data one tensor at a time (``write_tensor_data``), in declaration order. ``GGUFStreamWriter``
wraps that flow, so at most one tensor's data (or a memory-mapped view of it) is alive at a time.

Crash safety (the one safe-write path of ``convert`` and ``convert --to``; docs/USAGE.md §3):

* the file is written to a temporary file in the target folder, ``.NAME.PID.RANDOM.bitcos.tmp``, created
  with ``O_EXCL`` and held under an exclusive ``flock`` for the writer's whole life;
* ``finish`` flushes and fsyncs it, renames it onto the target (``os.replace``: atomic, so the target is
  either the old file or the complete new one) and then fsyncs the folder, so the rename itself survives
  a power loss; any error or interrupt removes the temporary file;
* a process killed with SIGKILL cannot clean up: the next writer into the same folder, whatever its target
  (``remove_stale_temps``, run by ``begin``), deletes the temporary files it can prove are stale leftovers
  of a killed writer: the name is the temporary-file pattern (any target), a regular file owned by this
  user, empty or starting with ``GGUF``, the PID in the name is not a running process, and its ``flock`` is
  free (a live writer holds it, also one in another PID namespace; the kernel releases it when the process
  dies, SIGKILL included). Anything else is left alone; the files removed are returned (``convert`` lists
  them).
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import secrets
import stat
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
from gguf import GGUFValueType, GGUFWriter
from gguf.gguf_writer import WriterState
from gguf.constants import GGMLQuantizationType
from gguf.quants import quant_shape_to_byte_shape

from . import types as _types  # (importing it registers the BITCOS types)

# ggml types whose data gguf-py writes element-typed; every other type is written as raw bytes
_PLAIN_DTYPES: dict[GGMLQuantizationType, np.dtype] = {
    GGMLQuantizationType.F32: np.dtype(np.float32),
    GGMLQuantizationType.F16: np.dtype(np.float16),
    GGMLQuantizationType.F64: np.dtype(np.float64),
    GGMLQuantizationType.I8: np.dtype(np.int8),
    GGMLQuantizationType.I16: np.dtype(np.int16),
    GGMLQuantizationType.I32: np.dtype(np.int32),
    GGMLQuantizationType.I64: np.dtype(np.int64),
}


COPY_CHUNK = 1 << 24  # bytes per write of a large tensor with a ``release`` callback


class GGUFStreamWriter:
    """Write a GGUF file tensor by tensor.

    Usage::

        with GGUFStreamWriter(out_path, arch="llama") as w:
            w.add_kv("llama.block_count", 2, GGUFValueType.UINT32)
            w.add_tensor_info("a", GGMLQuantizationType.F32, (256,))
            w.begin()                      # header, metadata, tensor infos
            w.write_tensor("a", array)     # in declaration order
        # on normal exit: flushed, fsync'ed, renamed onto out_path, folder fsync'ed; on error: temp file removed
    """

    def __init__(
        self, path: os.PathLike[str] | str, arch: str, *, alignment: int | None = None, overwrite: bool = False
    ):
        self.path = Path(path)
        self.overwrite = overwrite
        self._w = GGUFWriter(None, arch)
        # start from an empty key/value table so callers control the order (GGUFWriter pre-adds
        # general.architecture; copy_fields/add_kv put it back where the caller wants it)
        self._w.kv_data = [{}]
        if alignment is not None:
            self.set_alignment(alignment)
        self._order: list[str] = []
        self._infos: dict[str, tuple[GGMLQuantizationType, tuple[int, ...], int]] = {}
        self._next = 0
        self._tmp: Path | None = None
        self._lock_fd: int | None = None  # the temporary file, flock'ed while this writer lives
        self.removed_stale: list[Path] = []  # stale temporary files in the target's folder removed by begin()
        self._begun = False
        self._done = False

    # -- metadata ---------------------------------------------------------------------------------
    @property
    def alignment(self) -> int:
        return int(self._w.data_alignment)

    def set_alignment(self, alignment: int) -> None:
        if alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"alignment {alignment} is not a power of two")
        self._w.data_alignment = alignment

    def add_kv(self, key: str, value: Any, vtype: GGUFValueType, sub_type: GGUFValueType | None = None) -> None:
        if vtype == GGUFValueType.ARRAY and len(value) == 0:
            raise ValueError(f"metadata key {key}: GGUF arrays cannot be empty")
        self._w.kv_data[0][key] = _gguf_value(value, vtype, sub_type)
        if key == "general.alignment":
            self.set_alignment(int(value))

    def has_kv(self, key: str) -> bool:
        return key in self._w.kv_data[0]

    # -- tensors ----------------------------------------------------------------------------------
    def add_tensor_info(self, name: str, ggml_type: GGMLQuantizationType, ne: Sequence[int]) -> int:
        """Declare a tensor (ggml shape, ne0 first); returns its byte size."""
        if self._begun:
            raise RuntimeError("add_tensor_info after begin()")
        if name in self._infos:
            raise ValueError(f"duplicate tensor name {name!r}")
        ne = tuple(int(d) for d in ne)
        nbytes = _types.tensor_nbytes(int(ggml_type), ne)
        np_shape = tuple(reversed(ne))
        if ggml_type in _PLAIN_DTYPES:
            self._w.add_tensor_info(name, np_shape, _PLAIN_DTYPES[ggml_type], nbytes, raw_dtype=ggml_type)
        else:
            # a uint8 byte view: gguf-py maps the byte shape back to the logical one via GGML_QUANT_SIZES
            byte_shape = quant_shape_to_byte_shape(np_shape, ggml_type)
            self._w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), nbytes, raw_dtype=ggml_type)
        self._infos[name] = (ggml_type, ne, nbytes)
        self._order.append(name)
        return nbytes

    def begin(self) -> None:
        """Create the temporary file and write header, metadata and tensor infos."""
        if self._begun:
            raise RuntimeError("begin() called twice")
        if self.path.exists() and not self.overwrite:
            raise FileExistsError(f"{self.path} already exists")
        self.removed_stale = remove_stale_temps(self.path)
        self._tmp, self._lock_fd = _create_temp(self.path)
        self._begun = True
        self._w.write_header_to_file(self._tmp)
        self._w.write_kv_data_to_file()
        self._w.write_ti_data_to_file()

    def write_tensor(self, name: str, data: np.ndarray, *, release: Callable[[], None] | None = None) -> None:
        """Write the next tensor's data (any dtype/shape with the declared byte size, C-contiguous).

        ``release``: called after each ``COPY_CHUNK`` bytes of a large tensor (and once after a small one);
        a caller copying from a memory map passes its ``release_pages``, so a copied tensor never has more
        than one chunk of mapped pages resident."""
        if not self._begun:
            raise RuntimeError("write_tensor before begin()")
        if self._next >= len(self._order) or self._order[self._next] != name:
            expected = self._order[self._next] if self._next < len(self._order) else "(none)"
            raise RuntimeError(f"tensor {name!r} written out of order; expected {expected!r}")
        _type, _ne, nbytes = self._infos[name]
        if data.nbytes != nbytes:
            raise ValueError(f"tensor {name!r}: {data.nbytes} bytes given, {nbytes} declared")
        if not data.flags.c_contiguous:
            data = np.ascontiguousarray(data)
        w = self._w
        if (
            release is not None
            and nbytes > COPY_CHUNK
            and w.fout is not None
            and len(w.fout) == 1
            and next(iter(w.tensors[0]), None) == name
        ):
            # GGUFWriter.write_tensor_data's steps (pad, data, pad), the data in chunks
            fout = w.fout[0]
            w.tensors[0].pop(name)
            w.write_padding(fout, fout.tell())
            flat = data.reshape(-1).view(np.uint8)
            for i in range(0, nbytes, COPY_CHUNK):
                flat[i : i + COPY_CHUNK].tofile(fout)
                release()
            w.write_padding(fout, nbytes)
            w.state = WriterState.WEIGHTS
        else:
            w.write_tensor_data(data)
            if release is not None:
                release()
        self._next += 1

    def flush(self) -> Path:
        """Flush what was written so far and return the temporary file's path (e.g. to verify it
        before ``finish`` renames it onto the target)."""
        if self._tmp is None:
            raise RuntimeError("flush before begin()")
        self._w.flush()
        return self._tmp

    def finish(self) -> Path:
        if self._next != len(self._order):
            raise RuntimeError(f"only {self._next} of {len(self._order)} tensors written")
        assert self._tmp is not None and self._w.fout is not None
        self._w.flush()
        for f in self._w.fout:
            os.fsync(f.fileno())
        self._w.close()
        if self.path.exists() and not self.overwrite:
            raise FileExistsError(f"{self.path} already exists")
        os.replace(self._tmp, self.path)
        self._tmp = None
        fsync_dir(self.path.parent)
        self._unlock()
        self._done = True
        return self.path

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    def abort(self) -> None:
        """Close and delete the temporary file (safe to call at any point, more than once)."""
        try:
            self._w.close()
        except OSError:
            pass
        if self._tmp is not None:
            try:
                self._tmp.unlink()
            except FileNotFoundError:
                pass
            self._tmp = None
        self._unlock()

    def __enter__(self) -> GGUFStreamWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None and self._begun and not self._done:
            try:
                self.finish()
            except BaseException:
                self.abort()
                raise
        elif not self._done:
            self.abort()


# --- the safe-write path's helpers ------------------------------------------------------------------

TEMP_SUFFIX = ".bitcos.tmp"


def _temp_pattern(target: Path | None = None) -> re.Pattern[str]:
    """Names of the temporary files of ``target`` (None: of any target): ``.NAME.PID.RANDOM.bitcos.tmp``,
    RANDOM 8 hex digits; group 1 is the PID. (A PID has at most 7 digits, so no other target's temporary
    file matches a target's pattern.)"""
    name = re.escape(target.name) if target is not None else r".+"
    return re.compile(r"\." + name + r"\.([0-9]{1,10})\.[0-9a-f]{8}" + re.escape(TEMP_SUFFIX))


def _create_temp(target: Path) -> tuple[Path, int]:
    """Create the temporary file of ``target`` (``O_EXCL``; mode 0666 & ~umask, as a plain ``open`` would)
    and take its exclusive ``flock``; returns (path, the locked fd)."""
    folder = target.parent if str(target.parent) else Path(".")
    for _ in range(100):
        tmp = folder / f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}{TEMP_SUFFIX}"
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o666)
        except FileExistsError:
            continue
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a fresh file: nobody else can hold it
        return tmp, fd
    raise FileExistsError(errno.EEXIST, "cannot create a unique temporary file", str(folder))


def _pid_running(pid: int) -> bool:
    if pid <= 0:
        return True  # not a PID this code writes: treat as alive (never removed)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, another user's
    except OverflowError:
        return False
    return True


def remove_stale_temps(target: os.PathLike[str] | str) -> list[Path]:
    """Delete the temporary files interrupted writers (SIGKILL, power loss) left in ``target``'s folder, for
    any target, when each is provably stale; returns the paths removed. Proof, all of: the name is the
    temporary-file pattern; a regular file (not a link) owned by this user; empty or starting with ``GGUF``;
    the PID in its name is no running process; its ``flock`` is free (every live writer holds it). The file
    is unlinked while this process holds that lock. Anything unproven is kept."""
    target = Path(target)
    folder = target.parent if str(target.parent) else Path(".")
    pat = _temp_pattern()
    removed: list[Path] = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    for name in names:
        m = pat.fullmatch(name)
        if m is None or _pid_running(int(m.group(1))):
            continue
        path = folder / name
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if not (stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()):
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # a live writer holds it
            head = os.pread(fd, 4, 0)
            if head != b"GGUF"[: len(head)]:
                continue  # not a GGUF file this writer started
            # still the same file under that name (not replaced since we opened it)?
            try:
                now = os.lstat(path)
            except FileNotFoundError:
                continue
            if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                continue
            os.unlink(path)
            removed.append(path)
        finally:
            os.close(fd)
    if removed:
        fsync_dir(folder)
    return removed


def fsync_dir(folder: os.PathLike[str] | str) -> None:
    """fsync a folder, so a rename or unlink in it is durable (POSIX needs this after ``rename``)."""
    folder = Path(folder) if str(folder) else Path(".")
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise  # a file system that cannot fsync a folder (some FUSE ones) is no error
    finally:
        os.close(fd)


def _gguf_value(value: Any, vtype: GGUFValueType, sub_type: GGUFValueType | None) -> Any:
    from gguf.gguf_writer import GGUFValue

    return GGUFValue(value=value, type=vtype, sub_type=sub_type)
