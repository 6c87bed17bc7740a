"""CI-sized fuzz runs (docs/FUZZING.md): the kernel fuzzer (generic / AVX2 / AVX-512 on random valid BITCOS
matrices, every buffer against a PROT_NONE guard page, ASan+UBSan, bit identity with the generic kernel), the
loader fuzzer (mutated BITCOS GGUF files through llama_model_load_from_file of the installed patched libllama:
no crash, abort or hang), and the replay of every input a fuzzer ever crashed on (tests/data/fuzz-regressions/)
with its outcome.
About a minute in all on the 2-core development machine; the long runs are `tests/fuzzing.py` commands."""

from __future__ import annotations

import os
import shutil
import re
import subprocess
from pathlib import Path

import pytest

import fuzzing


@pytest.fixture(scope="module")
def kernel_fuzzer(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("kfuzz")
    cc = fuzzing._cc()
    if cc is None:
        pytest.skip("no C compiler")
    sanitize = fuzzing.sanitizers_work(cc, folder)
    built: dict[int, Path] = {}

    def get(fma: int) -> Path:
        if fma not in built:
            built[fma] = fuzzing.build_kernel_fuzzer(folder / f"fma{fma}", fma, sanitize)
        return built[fma]

    get.sanitize = sanitize  # type: ignore[attr-defined]
    return get


def _run(exe: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(exe), *args], capture_output=True, text=True, timeout=timeout, env=fuzzing.sanitizer_env()
    )


@pytest.mark.parametrize("fma, guard, cases", [(1, "end", 4000), (1, "front", 1500), (0, "end", 1500)])
def test_kernel_fuzz(kernel_fuzzer, fma: int, guard: str, cases: int) -> None:
    """Random valid matrices (both variants, k = 128..6144, odd multiples of 128, densities 0..1, row runs
    starting mid-tensor, 1..20 columns) with blocks, pool (exactly the format's tail), sign positions,
    activations and outputs each against a guard page: AVX2 / AVX-512 equal the generic kernel bit for bit."""
    r = _run(
        kernel_fuzzer(fma), "--seed", str(11 + fma), "--cases", str(cases), *(["--front"] if guard == "front" else [])
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert f"ok: {cases} cases" in r.stdout, r.stdout
    if os.uname().machine == "x86_64":
        kernels = r.stdout.splitlines()[0]
        cpu = Path("/proc/cpuinfo").read_text()
        if " avx2 " in cpu:
            assert "avx2" in kernels, kernels
        if all(
            f" {f} " in cpu
            for f in (
                "avx512f",
                "avx512bw",
                "avx512vl",
                "avx512_vnni",
                "avx512_vbmi2",
                "avx512_bitalg",
                "avx512_vpopcntdq",
            )
        ):
            assert "avx512" in kernels, kernels


@pytest.mark.parametrize("arch", sorted(fuzzing.CROSS_TARGETS))
@pytest.mark.parametrize("fma", (0, 1), ids=("nofma", "fma"))
def test_kernel_fuzz_cross(tmp_path: Path, fma: int, arch: str) -> None:
    """The kernels of another architecture's build (its table: generic, portable and the manifest's kernels of
    that architecture) cross-compiled (aarch64: Debian's gcc-aarch64-linux-gnu) and run under qemu-user on the
    manifest's qemu_cpu, which has every extension, so every path runs, and on its qemu_cpu_baseline, which has
    none, so the table drops every kernel that asks the CPU: every kernel equal to the generic one bit for bit,
    buffers against guard pages, both FMA forms. Skipped without the toolchain (fails instead under
    BITCOS_REQUIRE_<ARCH>=1, as CI sets BITCOS_REQUIRE_AARCH64: scripts/install.sh installs it)."""
    cross = fuzzing.KERNELS.arches[arch].cross
    cc, runner = fuzzing.CROSS_TARGETS[arch]
    if shutil.which(cc) is None or shutil.which(runner[0]) is None:
        if os.environ.get(f"BITCOS_REQUIRE_{arch.upper()}") == "1":
            pytest.fail(f"{cc} or {runner[0]} is missing but BITCOS_REQUIRE_{arch.upper()}=1")
        pytest.skip(f"no {arch} cross toolchain ({cc}, {runner[0]}: apt-get install {' '.join(cross.apt_packages)})")
    exe = fuzzing.build_kernel_fuzzer(tmp_path, fma, sanitize=False, target=arch)
    r = subprocess.run(
        [*runner, str(exe), "--seed", str(21 + fma), "--cases", "1500"], capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert "ok: 1500 cases" in r.stdout, r.stdout
    names = [k.name for k in (*fuzzing.KERNELS.baseline_kernels, *fuzzing.KERNELS.kernels_of(arch))]
    assert r.stdout.splitlines()[0].startswith(f"kernels: {' '.join(names)} ("), r.stdout
    # a core without the extensions: a kernel whose availability asks the CPU must not be offered
    always = [k.name for k in (*fuzzing.KERNELS.baseline_kernels, *fuzzing.KERNELS.kernels_of(arch)) if not k.cpu_check]
    baseline = cross.run_command(cross.qemu_cpu_baseline)
    r = subprocess.run(
        [*baseline, str(exe), "--seed", "5", "--cases", "200"], capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert r.stdout.splitlines()[0].startswith(f"kernels: {' '.join(always)} ("), r.stdout


def test_kernel_fuzz_guard_is_live(kernel_fuzzer) -> None:
    """Self-test: with the pool's format tail taken away, some kernel read must hit the guard page (so the
    fuzzer's buffers really end where the format says, and a kernel over-read would be caught)."""
    r = _run(kernel_fuzzer(1), "--seed", "3", "--cases", "400", "--short-tail", "64")
    assert r.returncode != 0, r.stdout[-2000:]
    assert "SEGV" in r.stderr or r.returncode < 0, r.stderr[-2000:]


@pytest.fixture(scope="module")
def loader_fuzzer(tmp_path_factory: pytest.TempPathFactory, patched_llama):
    lib = fuzzing.installed_llama_lib()
    if lib is None:
        pytest.skip("the patched llama-cpp-python is not installed (scripts/install.sh)")
    try:
        fuzzing.llama_include_dirs()
    except RuntimeError as e:
        pytest.skip(str(e))
    folder = tmp_path_factory.mktemp("lfuzz")
    exe = fuzzing.build_loader_fuzzer(folder, lib, sanitize=False)
    return exe, fuzzing.make_seeds(folder / "seeds"), fuzzing.make_refused_seeds(folder / "seeds")


def test_loader_fuzz(loader_fuzzer, tmp_path: Path) -> None:
    """40,000 mutated BITCOS models (companion headers, row index, pool, scales, bitmaps, tensor types, other
    tensors retyped with their data, shapes, offsets, names, hyper-parameters and other KV values, alignments,
    truncation, ...) through llama_model_load_from_file with random load / lazy modes; every 4th accepted one also
    decodes. No crash, abort or hang; both outcomes occur, and each kind of check refuses some."""
    exe, seeds, refused = loader_fuzzer
    r = fuzzing.run_loader(
        exe, seeds, cases=40000, seed=5, out=tmp_path, timeout=600, extra=["--timeout", "30"], refused=refused
    )
    crashes = sorted(p.name for p in tmp_path.iterdir())
    assert r.returncode == 0 and not crashes, (crashes, (r.stdout + r.stderr)[-4000:])
    m = re.search(r"ok: (\d+) cases .*?: (\d+) accepted, (\d+) refused, (\d+) decoded", r.stdout)
    assert m, r.stdout[-3000:]
    cases, accepted, refused, decoded = map(int, m.groups())
    assert cases == 40000 and accepted > 1000 and refused > 30000 and decoded > 200, m.group(0)
    assert "invalid BITCOS tensor" in r.stdout  # the BITCOS validator refuses most of the BITCOS cases
    assert "is used with GET_ROWS" in r.stdout  # the use check (refused seeds)
    assert "invalid hyperparameters in the model file" in r.stdout  # load_hparams' checks (were GGML_ASSERTs)
    assert "has wrong type" in r.stdout  # a hyper-parameter KV of another type
    assert "has the integer type" in r.stdout  # an integer weight
    assert "no device here runs" in r.stdout  # a weight of a type without a CPU kernel for its op
    assert "is not a power of" in r.stdout  # general.alignment


def test_loader_fuzz_is_deterministic(loader_fuzzer, tmp_path: Path) -> None:
    """A case is reproducible alone (--first I --cases 1 --save writes exactly the bytes the run loaded)."""
    exe, seeds, _ = loader_fuzzer
    a = fuzzing.run_loader(exe, seeds, cases=1, first=1234, seed=5, out=tmp_path / "a", extra=["--save"])
    b = fuzzing.run_loader(exe, seeds, cases=1, first=1234, seed=5, out=tmp_path / "b", extra=["--save"])
    assert a.returncode == 0 and b.returncode == 0, a.stderr[-2000:]
    fa, fb = tmp_path / "a" / "case-5-1234.gguf", tmp_path / "b" / "case-5-1234.gguf"
    assert fa.read_bytes() == fb.read_bytes()
    assert fa.read_bytes() != seeds[1234 % len(seeds)].read_bytes()


def _regressions(sub: str = "") -> list[Path]:
    return sorted((fuzzing.REGRESSIONS / sub).glob("*.gguf")) if (fuzzing.REGRESSIONS / sub).is_dir() else []


# Each regression input's outcome with every load / lazy mode (docs/FUZZING.md §4): the loads accepted of 13, the
# models decoded, and a substring of the last refusal reason ("" when accepted).
REGRESSION_OUTCOMES = {
    # issue 13: BITCOS on gemma4's lazily read per_layer_token_embd (--lazy-mode on) aborted in ggml-backend
    "lazy-bitcos-per-layer-token-embd.gguf": (0, 0, "BITCOS tensor 'per_layer_token_embd.weight' (bitcos_pt) is used"),
    # finding 6: general.file_type out of llama_ftype's range (UB): kept in range, the model loads
    "ubsan-file-type-out-of-range.gguf": (13, 13, ""),
    # finding 1: expert_count > LLAMA_MAX_EXPERTS aborted in load_hparams
    "n-expert-over-max.gguf": (
        0,
        0,
        "invalid hyperparameters in the model file: hparams.n_expert <= LLAMA_MAX_EXPERTS",
    ),
    # finding 2: expert_used_count 0 with experts aborted in load_hparams
    "n-expert-used-zero.gguf": (0, 0, "invalid hyperparameters in the model file: n_expert_used_max > 0"),
    # finding 3: an I32 norm weight aborted in ggml-cpu's MUL at decode
    "norm-weight-i32-decode.gguf": (
        0,
        0,
        "tensor 'blk.0.ffn_norm.weight' has the integer type i32; a model's weights are float or quantized",
    ),
    # finding 8: alignment 4 changed to 2 aborted under mmap (data off 32 bytes); read instead, the shifted
    # companion is refused
    "mmap-alignment-2.gguf": (0, 0, "invalid BITCOS tensor 'blk.0.attn_q.weight': bad companion magic"),
    # finding 8: a valid model with general.alignment 2 is read instead of mapped, loads and decodes in every mode
    "alignment-2-read-not-mapped.gguf": (13, 13, ""),
    # finding 9: a negative norm epsilon aborted in ggml-cpu's RMS_NORM at decode
    "rms-epsilon-negative.gguf": (
        0,
        0,
        "invalid hyperparameters in the model file: std::isfinite(hparams.f_norm_rms_eps) && hparams.f_norm_rms_eps",
    ),
    # finding 10: types without a CPU kernel for the tensor's op aborted or crashed at decode
    "norm-weight-f16.gguf": (0, 0, "no device here runs MUL on tensor 'blk.0.attn_norm.weight' (type f16, 128)"),
    "token-embd-i8-get-rows.gguf": (0, 0, "tensor 'token_embd.weight' has the integer type i8;"),
    "token-embd-q8-1-get-rows.gguf": (0, 0, "no device here runs GET_ROWS on tensor 'token_embd.weight' (type q8_1"),
    "per-layer-token-embd-i32.gguf": (0, 0, "tensor 'per_layer_token_embd.weight' has the integer type i32;"),
    "ffn-gate-inp-f64.gguf": (0, 0, "no device here runs MUL_MAT on tensor 'blk.0.ffn_gate_inp.weight' (type f64"),
    # finding 11: gemma4's rope.dimension_count odd aborted in ROPE at decode, 0 made it loop forever
    "rope-dims-odd.gguf": (0, 0, "invalid hyperparameters in the model file: hparams.n_rot_full % 2 == 0"),
    "rope-dims-zero.gguf": (0, 0, "invalid hyperparameters in the model file: hparams.n_rot_full > 0"),
    # finding 12: a Q1_0 token_embd made UBSan report a misaligned load in the x86 Q1_0 dot product
    "ubsan-q1-0-misaligned-load.gguf": (13, 13, ""),
    # finding 14: an F16 rope_freqs aborted the load in ggml_rope_ext (asked of the devices)
    "rope-freqs-f16.gguf": (0, 0, "no device here runs ROPE on tensor 'rope_freqs.weight' (type f16, 32)"),
    # finding 13: a 0-byte companion read with direct I/O passed a null pointer to memcpy
    "ubsan-empty-companion-direct-io.gguf": (0, 0, "invalid BITCOS tensor 'blk.0.ffn_down.weight': companion missing"),
}


def test_fuzz_regressions_replay(loader_fuzzer, tmp_path: Path) -> None:
    """Every input that once crashed or aborted the loader, or made a sanitizer report, replays cleanly with
    every load / lazy mode, with its outcome: refused with its reason, or loaded and decoded."""
    files = _regressions()
    assert sorted(p.name for p in files) == sorted(REGRESSION_OUTCOMES), "a regression input without its outcome"
    exe, _, _ = loader_fuzzer
    r = subprocess.run(
        [str(exe), "--replay", "--timeout", "30", "--out", str(tmp_path), *map(str, files)],
        capture_output=True,
        text=True,
        timeout=300,
        env=fuzzing.sanitizer_env(),
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert f"ok: replayed {len(files)} files" in r.stdout
    for f in files:
        accepted, decoded, reason = REGRESSION_OUTCOMES[f.name]
        m = re.search(
            rf"replay {re.escape(str(f))}: accepted (\d+) of 13 loads, (\d+) decoded; last reason: (.*)", r.stdout
        )
        assert m, (f.name, r.stdout)
        assert (int(m.group(1)), int(m.group(2))) == (accepted, decoded), (f.name, m.group(0))
        assert reason in m.group(3) and (reason or not m.group(3)), (f.name, m.group(0))


def test_split_model_companions_in_second_shard(loader_fuzzer, tmp_path: Path) -> None:
    """llama.cpp split files with every companion in the second shard (weight and companion from different
    files and mmaps): loads and decodes with every load / lazy mode; a broken row index there is refused."""
    exe, _, _ = loader_fuzzer
    good = fuzzing.split_seed(tmp_path / "m")
    bad = fuzzing.split_seed(tmp_path / "m", corrupt=True)
    r = subprocess.run(
        [str(exe), "--replay", "--out", str(tmp_path / "out"), str(good), str(bad)],
        capture_output=True,
        text=True,
        timeout=300,
        env=fuzzing.sanitizer_env(),
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert f"replay {good}: accepted 13 of 13 loads, 13 decoded;" in r.stdout, r.stdout
    assert (
        f"replay {bad}: accepted 0 of 13 loads, 0 decoded; last reason: invalid BITCOS tensor 'blk.0.attn_q.weight': "
        "row index" in r.stdout
    ), r.stdout
