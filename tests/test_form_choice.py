"""The in-memory form decision (csrc/bitcos-form.h, docs/KERNELS.md §9), through the harness library: the roofline
rule T = bytes / beta + gamma per form on hand-computed inputs (memory-bound, decode-bound, inside the margin,
an ARM-like CPU, this VM's numbers, z = 0 and 1, unknown inputs), the cache file of beta and its environment
overrides, the physical core count, and the gamma measurement returning usable numbers. No assertion on a timing:
which form is faster on this CPU is measured and reported (bench bandwidth), never asserted."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

import pytest

from ggml_bitcos import harness

CACHE_FILE = "cpu-bandwidth-v2.txt"
LINE = re.compile(r"^(?P<model>[^|\n]+)\|(?P<n>\d+) (?P<gbs>\d+\.\d{3})$")


@pytest.fixture
def choose(kernel_library):
    return harness.form_choose


@pytest.fixture
def cache_env(kernel_library, monkeypatch, tmp_path) -> Path:
    """No GGML_BITCOS_BETA, and GGML_BITCOS_CACHE_DIR a fresh directory (not made yet: the library makes it)."""
    monkeypatch.delenv("GGML_BITCOS_BETA", raising=False)
    d = tmp_path / "cache" / "ggml-bitcos"
    monkeypatch.setenv("GGML_BITCOS_CACHE_DIR", str(d))
    return d


def approx(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12)


# ---------------------------------------------------------------------------------------------------- the rule
def test_bytes_per_32_weights(choose):
    """(2 - z) * 4 bytes for BITCOS (a bitmap bit per weight, a sign bit per non-zero), 8 for the codes, the
    scales' scale_bits * 4 added to both."""
    c = choose(1.0, 1.0, 10.0, 1, 0.4)
    assert approx(c["bytes_bitcos"], 6.4) and approx(c["bytes_codes"], 8.0)
    c = choose(1.0, 1.0, 10.0, 1, 0.4, scale_bits=0.125)  # an fp16 scale per 128 weights
    assert approx(c["bytes_bitcos"], 6.9) and approx(c["bytes_codes"], 8.5)


def test_memory_bound_keeps_bitcos(choose):
    """2 GB/s per thread (a many-core server under load): both forms stream, BITCOS streams fewer bytes."""
    c = choose(1.0, 0.5, 2.0, 64, 0.4)
    assert approx(c["t_bitcos"], 6.4 / 2.0 + 1.0) and approx(c["t_codes"], 8.0 / 2.0 + 0.5)  # 4.2 ns < 4.5 ns
    assert c["form"] == "bitcos"


def test_decode_bound_picks_codes(choose):
    """30 GB/s per thread and a BITCOS decode 4x the codes kernel: both execute, the codes form wins by 4x."""
    c = choose(2.0, 0.5, 30.0, 1, 0.4)
    assert approx(c["t_bitcos"], 6.4 / 30 + 2.0) and approx(c["t_codes"], 8.0 / 30 + 0.5)
    assert c["form"] == "codes"


def test_inside_the_margin_keeps_bitcos(choose):
    """The codes form has to be predicted more than 5 % faster (BITCOS_FORM_MARGIN). With beta 1e6 GB/s the
    bytes cost nothing: T = gamma."""
    assert harness.FORM_MARGIN == 0.05
    assert choose(1.03, 1.0, 1e6, 1, 0.4)["form"] == "bitcos"  # 3 % faster: noise
    assert choose(1.049, 1.0, 1e6, 1, 0.4)["form"] == "bitcos"
    assert choose(1.051, 1.0, 1e6, 1, 0.4)["form"] == "codes"
    # the codes form's 1.6 more bytes per 32 weights at 8 GB/s (0.2 ns) against a BITCOS decode 0.2 ns dearer:
    # t_bitcos 6.4 / 8 + 0.5 = 1.3, t_codes 8 / 8 + 0.3 = 1.3
    assert choose(0.5, 0.3, 8.0, 1, 0.4)["form"] == "bitcos"


def test_arm_like_cpu_picks_codes(choose):
    """A NEON core: the BITCOS decode 5x the codes kernel (no pdep, no masked moves), 30 GB/s per thread."""
    c = choose(3.0, 0.6, 30.0, 4, 0.42)
    assert approx(c["t_bitcos"], 1.58 * 4 / 30 + 3.0) and approx(c["t_codes"], 8 / 30 + 0.6)
    assert c["form"] == "codes"


def test_this_vm_like_numbers(choose):
    """Numbers measured on the 2-core development VM (AVX-512 kernels, z = 0.42): gamma 0.63 / 0.40 ns per 32
    weights, 12.3 GB/s per thread streamed by 1 or 2 threads: the codes form (measured 8 % faster in tg there);
    under bench bandwidth's traffic, 4 GB/s per thread left: BITCOS. The crossover is near 9.9 GB/s per thread."""
    free = choose(0.63, 0.40, 12.3, 2, 0.42)
    assert approx(free["t_bitcos"], 1.58 * 4 / 12.3 + 0.63) and approx(free["t_codes"], 8 / 12.3 + 0.40)
    assert free["form"] == "codes"
    assert choose(0.63, 0.40, 4.0, 2, 0.42)["form"] == "bitcos"
    assert choose(0.63, 0.40, 9.5, 2, 0.42)["form"] == "bitcos"
    assert choose(0.63, 0.40, 10.5, 2, 0.42)["form"] == "codes"


def test_zero_density_edges(choose):
    """z = 0: both forms stream 8 bytes, so the decode decides (a tie keeps BITCOS); z = 1: BITCOS streams half
    the bytes. z outside [0, 1] is clamped."""
    tie = choose(0.5, 0.5, 1.0, 1, 0.0)
    assert approx(tie["t_bitcos"], 8.5) and approx(tie["t_codes"], 8.5) and tie["form"] == "bitcos"
    assert choose(2.0, 0.5, 100.0, 1, 0.0)["form"] == "codes"
    empty = choose(1.0, 0.5, 1.0, 1, 1.0)
    assert approx(empty["bytes_bitcos"], 4.0) and approx(empty["t_bitcos"], 5.0) and empty["form"] == "bitcos"
    assert approx(choose(1.0, 0.5, 1.0, 1, -0.5)["bytes_bitcos"], 8.0)
    assert approx(choose(1.0, 0.5, 1.0, 1, 1.5)["bytes_bitcos"], 4.0)


def test_unknown_inputs_keep_bitcos(choose):
    """No beta (0, a failed measurement) or no gamma (NaN): both times infinite, the stored form stays."""
    for c in (choose(2.0, 0.5, 0.0, 1, 0.4), choose(2.0, 0.5, float("nan"), 1, 0.4), choose(math.nan, 0.5, 30, 1, 0.4)):
        assert math.isinf(c["t_bitcos"]) and math.isinf(c["t_codes"]) and c["form"] == "bitcos"


# ------------------------------------------------------------------------------------------------ measurements
def test_physical_cores(kernel_library):
    assert 1 <= harness.form_physical_cores() <= (os.cpu_count() or 1)


def test_measure_beta(kernel_library):
    gbs = harness.form_measure_beta(1, 0.05)
    assert math.isfinite(gbs) and gbs > 0


def test_gamma_of_both_forms(kernel_library):
    """Positive, finite ns per 32 weights for the best kernel here and the generic one, at z = 0, 0.42 and 1;
    which form is faster is not asserted (a timing)."""
    for impl in dict.fromkeys((harness.best_kernel(), "generic")):
        for z in (0.0, 0.42, 1.0):
            gb, gc = harness.form_measure_gamma(impl, z, 0.01)
            assert all(math.isfinite(g) and g > 0 for g in (gb, gc)), (impl, z, gb, gc)
    with pytest.raises(KeyError):
        harness.form_measure_gamma("no-such-kernel", 0.4)


# ------------------------------------------------------------------------------------------------ the beta cache
def read_lines(d: Path) -> list[re.Match]:
    lines = (d / CACHE_FILE).read_text().splitlines()
    matches = [LINE.match(x) for x in lines]
    assert all(matches), lines
    return matches


def cached_once(n: int, d: Path) -> float:
    """form_beta_cached(n) until it has written its figure: a measurement whose thread was not running throughout
    (another process on its CPU) is returned but not cached."""
    for _ in range(20):
        gbs, measured = harness.form_beta_cached(n)
        assert measured and gbs > 0
        if (d / CACHE_FILE).exists():
            return gbs
    raise AssertionError("20 measurements, none undisturbed enough to cache")


def test_cache_measures_once_then_reads(cache_env: Path):
    """The first call measures and appends "<cpu model>|<n> <GB/s>" (making the directory), the second reads it."""
    gbs = cached_once(1, cache_env)
    (line,) = read_lines(cache_env)
    assert line["n"] == "1" and abs(float(line["gbs"]) - gbs) <= 0.0005
    again, measured = harness.form_beta_cached(1)
    assert not measured and again == float(line["gbs"])
    assert len(read_lines(cache_env)) == 1


def test_cache_key_is_model_and_threads(cache_env: Path):
    """A line counts only for its thread count; of several lines of one key the last valid one wins."""
    cached_once(1, cache_env)
    (line,) = read_lines(cache_env)
    model = line["model"]
    with open(cache_env / CACHE_FILE, "a") as f:
        f.write(f"{model}|3 12.500\n{model}|3 13.250\nother cpu|4 99.000\n{model}|3 -1.000\n")
    assert harness.form_beta_cached(3) == (13.25, False)
    assert harness.form_beta_cached(1) == (float(line["gbs"]), False)


def test_env_beta_overrides(cache_env: Path, monkeypatch):
    """GGML_BITCOS_BETA gives beta: no measurement, no file; a value that is no positive number is ignored (the
    first such call measures and writes the file, the others read it)."""
    monkeypatch.setenv("GGML_BITCOS_BETA", "7.5")
    assert harness.form_beta_cached(2) == (7.5, False)
    assert not cache_env.exists()
    monkeypatch.setenv("GGML_BITCOS_BETA", "fast")
    cached_once(1, cache_env)
    for ignored in ("0", "-3", ""):
        monkeypatch.setenv("GGML_BITCOS_BETA", ignored)
        gbs, measured = harness.form_beta_cached(1)
        assert gbs > 0 and not measured
    assert len(read_lines(cache_env)) == 1


def test_cache_dir_fallbacks(kernel_library, monkeypatch, tmp_path):
    """Without GGML_BITCOS_CACHE_DIR: $XDG_CACHE_HOME/ggml-bitcos, else $HOME/.cache/ggml-bitcos."""
    monkeypatch.delenv("GGML_BITCOS_BETA", raising=False)
    monkeypatch.setenv("GGML_BITCOS_CACHE_DIR", str(tmp_path / "first"))
    cached_once(1, tmp_path / "first")
    (line,) = read_lines(tmp_path / "first")
    monkeypatch.delenv("GGML_BITCOS_CACHE_DIR")
    for where, env in (
        (tmp_path / "xdg" / "ggml-bitcos", "XDG_CACHE_HOME"),
        (tmp_path / ".cache" / "ggml-bitcos", "HOME"),
    ):
        where.mkdir(parents=True)
        (where / CACHE_FILE).write_text(f"{line['model']}|1 {len(env)}.000\n")
        monkeypatch.setenv(env, str(where.parent.parent if env == "HOME" else where.parent))
        if env == "HOME":
            monkeypatch.delenv("XDG_CACHE_HOME")
        assert harness.form_beta_cached(1) == (float(len(env)), False)


def test_unwritable_cache_dir_measures(kernel_library, monkeypatch, tmp_path):
    """A cache directory that cannot be made (under a plain file): measure and return, every time."""
    monkeypatch.delenv("GGML_BITCOS_BETA", raising=False)
    (tmp_path / "plain").write_text("")
    monkeypatch.setenv("GGML_BITCOS_CACHE_DIR", str(tmp_path / "plain" / "cache"))
    for _ in range(2):
        gbs, measured = harness.form_beta_cached(1)
        assert measured and gbs > 0
