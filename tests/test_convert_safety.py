"""``convert`` is crash-safe and lean.

* SIGKILL of a real ``ggml-bitcos convert`` subprocess at several moments (before the temporary file
  exists, after its first bytes, half-way through the tensor data, when it has its full size: verify, fsync,
  rename) leaves the input byte-identical and an earlier output intact; the next run for the same output
  removes the stale temporary files (its own output's and, issue 30, any other output's in the folder) and
  keeps every temporary file it cannot prove is stale (a live process's, one under a live ``flock``, one that
  is no GGUF file, a symlink); a run into another output of the same folder removes them too;
* the folder is fsynced after the rename (``convert`` and ``convert --to``: one safe-write path);
* peak resident memory of a subprocess convert stays under the bound stated in docs/USAGE.md §4
  (``bound_bytes`` below) on a model whose input is far larger than that bound.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFValueType
from gguf.constants import GGMLQuantizationType as T

from ggml_bitcos import tq
from ggml_bitcos.convert import DEFAULT_CACHE_BYTES, convert
from ggml_bitcos.convert_back import convert_back
from ggml_bitcos.format import QK_K
from ggml_bitcos.ternary import random_codes
from gguf_tools import GGUFStreamWriter
from gguf_tools.writer import TEMP_SUFFIX, remove_stale_temps

ROOT = Path(__file__).resolve().parents[1]

# docs/USAGE.md §4: peak RSS <= BASE_BYTES + the encoding cache + WORKING_SET_PER_WEIGHT x the weights of the
# largest tensor convert decodes (the bytes of the largest copied tensor count at 1/8 of that per byte).
BASE_BYTES = 160 << 20
WORKING_SET_PER_WEIGHT = 8


def bound_bytes(max_tensor_weights: int) -> int:
    return BASE_BYTES + DEFAULT_CACHE_BYTES + WORKING_SET_PER_WEIGHT * max_tensor_weights


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _model(path: Path, *, n_ternary: int, rows: int, k: int, n_big: int, big_bytes: int, seed: int = 0) -> int:
    """A llama-named GGUF: ``n_ternary`` TQ2_0 weights (rows x k, z = 0.4) and ``n_big`` 1-D F32 tensors of
    ``big_bytes`` random bytes each (copied unchanged: they make the file large at little CPU cost).
    Returns the largest tensor's weight count."""
    rng = np.random.default_rng(seed)
    with GGUFStreamWriter(path, "llama") as w:
        w.add_kv("general.architecture", "llama", GGUFValueType.STRING)
        for i in range(n_ternary):
            w.add_tensor_info(f"blk.{i}.ffn_up.weight", T.TQ2_0, (k, rows))
        for i in range(n_big):
            w.add_tensor_info(f"extra.{i}", T.F32, (big_bytes // 4,))
        w.begin()
        for i in range(n_ternary):
            codes = random_codes(rng, (rows, k), 0.4)
            w.write_tensor(
                f"blk.{i}.ffn_up.weight", tq.tq2_0_encode(codes, np.full((rows, k // QK_K), 0.25, np.float16))
            )
        for i in range(n_big):
            w.write_tensor(f"extra.{i}", np.frombuffer(rng.bytes(big_bytes), np.uint8))
    return max(rows * k, big_bytes // 4)


def _sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _temps(folder: Path, out: Path) -> list[Path]:
    pat = re.compile(r"\." + re.escape(out.name) + r"\.\d+\.[0-9a-f]{8}" + re.escape(TEMP_SUFFIX))
    return sorted(p for p in folder.iterdir() if pat.fullmatch(p.name))


def _convert_cmd(src: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "ggml_bitcos", "convert", str(src), "-o", str(out), "--force", "-q"]


def _kill_when(src: Path, out: Path, cond, timeout: float = 60.0) -> tuple[int, int]:
    """Start a convert of src onto out and SIGKILL it as soon as ``cond(temp size or None, seconds)`` holds;
    returns (its PID, the temp file's size when killed, -1 for none). Fails if it exits first."""
    p = subprocess.Popen(_convert_cmd(src, out), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    t0 = time.monotonic()
    try:
        while True:
            if p.poll() is not None:
                pytest.fail(
                    f"convert finished (rc {p.returncode}) before the kill point: "
                    f"{p.stderr.read().decode()[-2000:] if p.stderr else ''}"
                )
            mine = [t for t in _temps(out.parent, out) if f".{p.pid}." in t.name]
            size = mine[0].stat().st_size if mine else None
            if cond(size, time.monotonic() - t0):
                p.send_signal(signal.SIGKILL)
                p.wait(10)
                assert p.returncode == -signal.SIGKILL
                return p.pid, -1 if size is None else size
            if time.monotonic() - t0 > timeout:
                pytest.fail("kill point not reached")
            time.sleep(0.0005)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_sigkill_at_any_moment_keeps_input_and_output_and_next_run_cleans_up(tmp_path: Path) -> None:
    src, out = tmp_path / "m.gguf", tmp_path / "m-bitcos.gguf"
    # the tensor data is ~160 MB (1-D F32, copied) so the temp file grows over several 1 ms polls
    _model(src, n_ternary=4, rows=256, k=1024, n_big=5, big_bytes=32 << 20)
    src_sha = _sha(src)
    r = subprocess.run(_convert_cmd(src, out), env=_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    full = out.stat().st_size
    out_sha = _sha(out)

    moments = {
        "before the temp file": lambda size, t: size is None and t > 0.3,
        "first bytes written": lambda size, t: size is not None and size > 0,
        "half the tensor data": lambda size, t: size is not None and size >= full // 2,
        "complete (verify/fsync/rename)": lambda size, t: size is not None and size >= full,
    }
    dead: list[int] = []
    for what, cond in moments.items():
        pid, size = _kill_when(src, out, cond)
        dead.append(pid)
        assert _sha(src) == src_sha, f"input changed by a kill at {what}"
        assert _sha(out) == out_sha, f"earlier output changed by a kill at {what}"
        temps = _temps(tmp_path, out)
        left = [t for t in temps if f".{pid}." in t.name]
        assert len(left) == (0 if size < 0 else 1), (what, size, left)  # SIGKILL: nobody could clean up
        if size >= 0:  # this run reached the writer: it removed the earlier killed runs' temp files
            assert temps == left, (what, temps)

    stale = _temps(tmp_path, out)
    assert len(stale) == 1

    # temp files the next run cannot prove are stale leftovers of its own target: all must survive
    live = tmp_path / f".{out.name}.{os.getpid()}.0badf00d{TEMP_SUFFIX}"  # a running process's PID
    live.write_bytes(b"GGUF" + bytes(60))
    other = tmp_path / f".other.gguf.{dead[0]}.0badf00d{TEMP_SUFFIX}"  # another output's, killed: stale too
    other.write_bytes(b"GGUF")
    stale.append(other)
    locked = tmp_path / f".{out.name}.{dead[1]}.1badf00d{TEMP_SUFFIX}"  # a live flock holds it
    locked.write_bytes(b"GGUF")
    not_gguf = tmp_path / f".{out.name}.{dead[2]}.2badf00d{TEMP_SUFFIX}"  # not a GGUF this writer began
    not_gguf.write_bytes(b"important data")
    link = tmp_path / f".{out.name}.{dead[3]}.3badf00d{TEMP_SUFFIX}"  # a symlink (to the input)
    link.symlink_to(src)
    keep = [live, locked, not_gguf, link]
    fd = os.open(locked, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        r = subprocess.run(
            [c for c in _convert_cmd(src, out) if c != "-q"], env=_env(), capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 0, r.stderr
    finally:
        os.close(fd)
    assert f"removed 2 stale temporary file(s) left in {tmp_path} by killed runs" in r.stderr, r.stderr
    assert all(p.name in r.stderr for p in stale), r.stderr
    assert _sha(out) == out_sha  # the same bytes as the first run
    assert _sha(src) == src_sha
    for p in stale:
        assert not p.exists(), f"stale temp file {p.name} not removed"
    for p in keep:
        assert os.path.lexists(p), f"{p.name} removed but not provably a stale temp file of this output"
    assert stat.S_ISLNK(os.lstat(link).st_mode) and _sha(src) == src_sha
    # once the lock is released the flock'ed one is provably stale too; the others still are not
    assert remove_stale_temps(out) == [locked]
    assert all(os.path.lexists(p) for p in keep if p != locked)


def _fsync_spy(monkeypatch, out: Path) -> list[tuple[str, bool]]:
    """Record every os.fsync as (kind: 'dir' or 'file', whether out existed then)."""
    calls: list[tuple[str, bool]] = []
    real = os.fsync

    def spy(fd: int) -> None:
        calls.append(("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file", out.exists()))
        real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    return calls


def test_folder_fsynced_after_rename(tmp_path: Path, monkeypatch) -> None:
    src, out = tmp_path / "m.gguf", tmp_path / "m-bitcos.gguf"
    _model(src, n_ternary=2, rows=64, k=512, n_big=1, big_bytes=1 << 16)
    calls = _fsync_spy(monkeypatch, out)
    convert(src, out, progress=False)
    assert ("file", False) in calls  # the temp file before the rename
    assert calls[-1] == ("dir", True), calls  # the folder after it

    back = tmp_path / "m-back.gguf"  # convert --to: the same safe-write path
    calls = _fsync_spy(monkeypatch, back)
    convert_back(out, back, to="tq2_0", progress=False)
    assert ("file", False) in calls and calls[-1] == ("dir", True), calls


_MEASURE = textwrap.dedent("""
    import resource, subprocess, sys
    r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, r.stderr[-2000:].replace("\\n", " | "))
""")


def peak_rss(cmd: list[str]) -> tuple[int, int, str]:
    """(exit status, peak RSS in bytes, stderr tail) of ``cmd`` run as the only child of a fresh process (so
    RUSAGE_CHILDREN sees no other child of the test session)."""
    r = subprocess.run([sys.executable, "-c", _MEASURE, *cmd], env=_env(), capture_output=True, text=True, timeout=600)
    rc, kb, err = r.stdout.split(" ", 2)
    return int(rc), int(kb) * 1024, err


def test_peak_memory_bounded_by_largest_tensor(tmp_path: Path) -> None:
    """~460 MB of input whose largest tensor is 12 M weights (48 MB): the old converter mapped (and
    counted) every page it touched, input and output, plus up to 1 GiB of cached encodings (> 1.1 GB here)."""
    src, out = tmp_path / "m.gguf", tmp_path / "m-bitcos.gguf"
    w_max = _model(src, n_ternary=8, rows=1024, k=2048, n_big=9, big_bytes=48 << 20)
    size = src.stat().st_size
    rc, peak, err = peak_rss(_convert_cmd(src, out))
    assert rc == 0, err
    bound = bound_bytes(w_max)
    print(
        f"input {size / 1e6:.0f} MB, largest tensor {w_max:,} weights: peak RSS {peak / 1e6:.0f} MB, "
        f"bound {bound / 1e6:.0f} MB"
    )
    assert bound < size  # the model makes the difference clear
    assert peak <= bound, f"peak RSS {peak / 1e6:.0f} MB > bound {bound / 1e6:.0f} MB (input {size / 1e6:.0f} MB)"


def test_cache_mb_option_changes_memory_not_bytes(tmp_path: Path) -> None:
    """--cache-mb 0 (every tensor encoded again when written) writes the same bytes as the default."""
    from ggml_bitcos.cli import main

    src = tmp_path / "m.gguf"
    _model(src, n_ternary=3, rows=64, k=512, n_big=1, big_bytes=1 << 12)
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    assert main(["convert", str(src), "-o", str(a), "-q"]) == 0
    assert main(["convert", str(src), "-o", str(b), "-q", "--cache-mb", "0"]) == 0
    assert a.read_bytes() == b.read_bytes()
    assert main(["convert", str(src), "-o", str(b), "-q", "--force", "--cache-mb", "-1"]) == 1
