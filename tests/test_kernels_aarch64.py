"""The aarch64 kernels (csrc/bitcos-kernels-neon.c: neon, neon-dotprod) and their codes-form kernels
(csrc/bitcos-kernels-codes-neon.c) under qemu-user, against the generic kernel and against the numpy evaluation of
the arithmetic contract (``contract.reference_mm``).

Python cannot load an aarch64 library here, so the cases go through a file: Python encodes random codes with the
reference codec (``harness.encode_rows``, the descriptors the harness library gets on x86), writes them for
tests/c/bitcos-kernel-cases.c, cross-compiled with Debian's gcc-aarch64-linux-gnu with the kernel table and every
kernel object of an aarch64 harness (tests/fuzzing.py, build_kernel_program, from csrc/bitcos-kernels.json), runs it under
``qemu-aarch64 -cpu max`` (which has dotprod, so every ARM path runs) and compares each kernel's float bits with
the generic kernel's and with numpy's, and so does each kernel's codes-form kernel (docs/KERNELS.md §8) on the
case decoded into 2-bit codes. Cases: every variant of both format versions, K = 32, 96, 160, 256, 640,
768, 2080 where the variant allows it (partial last units, a Q8_K block with one half), zero densities 0 / 0.4 / 1,
1 .. 17 columns, 1 .. 17 rows, both FMA forms; one case with a flipped sign bit must differ from numpy (the
comparison's self-test). Skipped without the cross toolchain unless
BITCOS_REQUIRE_AARCH64=1 (then it fails), as test_kernel_fuzz_aarch64 does.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import fuzzing
from ggml_bitcos import contract, harness
from ggml_bitcos.format import QK, Variant
from ggml_bitcos.q8k import random_q8k
from ggml_bitcos.ternary import random_codes

# the manifest's aarch64 kernels (csrc/bitcos-kernels.json), in table order: the last is the best under qemu_cpu
ARM_KERNELS = tuple(k.name for k in fuzzing.KERNELS.kernels_of("aarch64"))
KS = (32, 96, 160, 256, 640, 768, 2080)
ZS = (0.0, 0.4, 1.0)
NRS = (1, 3, 17)
CODES = "/2bit"  # a codes-form kernel's results: NAME/2bit, as `bench kernels` names them


def _toolchain() -> tuple[str, list[str]]:
    cc, runner = fuzzing.CROSS_TARGETS["aarch64"]
    if shutil.which(cc) is None or shutil.which(runner[0]) is None:
        if os.environ.get("BITCOS_REQUIRE_AARCH64") == "1":
            pytest.fail(f"{cc} or {runner[0]} is missing but BITCOS_REQUIRE_AARCH64=1")
        apt = " ".join(fuzzing.KERNELS.arches["aarch64"].cross.apt_packages)
        pytest.skip(f"no aarch64 cross toolchain ({cc}, {runner[0]}: apt-get install {apt})")
    return cc, runner


class ArmCase:
    """Random codes and scales of one variant, their encoded rows (the C descriptor's arrays) and activations."""

    def __init__(self, seed: int, variant: Variant, k: int, z: float, nr: int, nc: int, corrupt: bool = False):
        rng = np.random.default_rng(seed)
        self.variant, self.k, self.nr, self.nc, self.corrupt = variant, k, nr, nc, corrupt
        self.codes = random_codes(rng, (nr, k), z)
        self.block_scales = None
        if variant.scale_block:
            ds = rng.uniform(0.0, 2.0, size=(nr, k // variant.scale_block)).astype(np.float16)
            if variant.scale_block == QK:  # half of the Q8_K blocks with two equal unit scales (one FMA per lane)
                same = rng.random(ds[:, 1::2].shape) < 0.5
                ds[:, 1::2] = np.where(same, ds[:, 0::2][:, : ds[:, 1::2].shape[1]], ds[:, 1::2])
            self.block_scales = ds
        self.scale = float(np.float32(rng.uniform(0.05, 3.0)))
        self.row_scales = rng.uniform(0.05, 3.0, size=nr).astype(np.float32) if variant is Variant.ROW else None
        self.w = harness.encode_rows(
            self.codes, variant, block_scales=self.block_scales, scale=self.scale, row_scales=self.row_scales
        )
        self.y = random_q8k(rng, nc, k)
        self.y["d"] *= np.where(rng.random(self.y["d"].shape) < 0.3, -1.0, 1.0).astype(np.float32)

    def record(self) -> bytes:
        """The case in tests/c/bitcos-kernel-cases.c's input format."""
        d = self.w.descriptor()
        bs = np.zeros(0, np.uint8) if d.block_scale is None else np.ascontiguousarray(d.block_scale).view(np.uint8)
        head = [
            self.k,
            self.nr,
            self.nc,
            d.unit_bytes,
            d.bits.shape[1],
            d.pool.nbytes,
            d.row_scale is not None,
            bs.nbytes,
            d.block_scale_offset,
            d.scale_stride,
            d.scale_row_bytes,
            d.block_scale_shift,
        ]
        pool = d.pool.copy()
        if self.corrupt:  # the first sign of row 0 flipped: the kernels then compute other codes than numpy
            p = int(d.sign_pos[0])
            pool[p >> 3] ^= np.uint8(1 << (p & 7))
        parts = [np.array(head, "<i8").tobytes(), d.bits.tobytes(), pool.tobytes(), d.sign_pos.astype("<u8").tobytes()]
        if d.row_scale is not None:
            parts.append(d.row_scale.astype("<f4").tobytes())
        parts += [bs.tobytes(), np.ascontiguousarray(self.y).tobytes()]
        return b"".join(parts)

    def reference(self, fma: bool) -> np.ndarray:
        return contract.reference_mm(
            self.codes,
            self.variant,
            self.y,
            block_scales=self.block_scales,
            scale=self.scale,
            row_scales=self.row_scales,
            fma=fma,
        )


def _cases() -> list[ArmCase]:
    cases, i = [], 0
    for variant in Variant:
        for k in KS:
            if k % variant.k_multiple:
                continue
            for z in ZS:
                nc = 1 + i % 17  # every column count 1 .. 17 over the cases
                cases.append(ArmCase(1000 + i, variant, k, z, NRS[i % len(NRS)], nc))
                i += 1
    # the comparison's self-test: one case with a flipped sign (row 0 has a non-zero weight at z = 0.4)
    cases.append(ArmCase(999, Variant.MATRIX, 2080, 0.4, 3, 4, corrupt=True))
    return cases


@pytest.fixture(scope="module")
def arm_cases() -> list[ArmCase]:
    return _cases()


@pytest.mark.parametrize("fma", (1, 0), ids=("fma", "nofma"))
def test_arm_kernels_equal_generic_and_numpy(tmp_path: Path, arm_cases: list[ArmCase], fma: int) -> None:
    """Every ARM kernel, and its codes-form kernel on the case's rows decoded into 2-bit codes (NAME/2bit: the
    GEMV tiles of 3 rows and their single-row tail, the GEMM tiles of 4 columns and the columns past them, a last
    block of one half), gives exactly the generic kernel's float bits and numpy's (the contract), every case."""
    _toolchain()
    runner = fuzzing.CROSS_TARGETS["aarch64"][1]
    exe = fuzzing.build_kernel_program(
        tmp_path, fuzzing.CTESTS / "bitcos-kernel-cases.c", fma, sanitize=False, target="aarch64", opt="-O2"
    )
    src, out = tmp_path / "cases.bin", tmp_path / "out.bin"
    src.write_bytes(b"".join(c.record() for c in arm_cases) + np.zeros(12, "<i8").tobytes())
    r = subprocess.run([*runner, str(exe), str(src), str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    names = r.stdout.splitlines()[0].split()[1:]
    assert r.stdout.splitlines()[1] == f"cases: {len(arm_cases)}", r.stdout
    assert all(n in names for n in ARM_KERNELS), names
    # the best entry is named once per process, however often it is asked for (the ggml glue's load-time line)
    assert [x for x in r.stderr.splitlines() if x.startswith("BITCOS CPU kernel:")] == [
        f"BITCOS CPU kernel: {ARM_KERNELS[-1]}"
    ], r.stderr
    data, off = out.read_bytes(), 0
    checked = {n: 0 for n in names}
    for c in arm_cases:
        want = c.reference(bool(fma)).view(np.uint32)
        results = {}
        for n in names:
            ran = int(np.frombuffer(data, "<i4", 1, off)[0])
            res = np.frombuffer(data, "<f4", 2 * c.nc * c.nr, off + 4).reshape(2, c.nc, c.nr)
            off += 4 + 8 * c.nc * c.nr
            assert ran == 1, f"{n} did not run under qemu -cpu max"
            results[n] = res[0].view(np.uint32)
            results[n + CODES] = res[1].view(np.uint32)
        what = f"{c.variant.name} k={c.k} nr={c.nr} nc={c.nc} fma={fma}"
        for n in results:
            np.testing.assert_array_equal(results[n], results["generic"], err_msg=f"{n} vs generic, {what}")
            if c.corrupt:
                assert not np.array_equal(results[n], want), f"{n}: a flipped sign went unnoticed, {what}"
            else:
                np.testing.assert_array_equal(results[n], want, err_msg=f"{n} vs numpy, {what}")
            checked[n] = checked.get(n, 0) + 1
    assert off == len(data)
    assert all(checked[n] == checked[n + CODES] == len(arm_cases) for n in ARM_KERNELS), checked


# -march of llama.cpp's ARM CPU variants (ggml/src/CMakeLists.txt, GGML_CPU_ALL_VARIANTS / GGML_CPU_ARM_ARCH) and the
# one NEON kernel each compiles in
GGML_ARM_BUILDS = (
    ("armv8-a", "neon"),
    ("armv8.2-a+dotprod", "neon-dotprod"),
    ("armv8.6-a+dotprod+i8mm", "neon-dotprod"),
)


@pytest.mark.parametrize("march,kernel", GGML_ARM_BUILDS, ids=[m for m, _ in GGML_ARM_BUILDS])
def test_ggml_arm_variant_builds_one_neon_kernel(tmp_path: Path, march: str, kernel: str) -> None:
    """Built as ggml-cpu builds a CPU variant (every kernel file and the table with the variant's flags, no
    BITCOS_KERNELS_PER_FILE_FLAGS), the table holds exactly the NEON kernel those flags allow, and that is the
    kernel the load-time line names."""
    cc, runner = _toolchain()
    flags = ["-std=c11", "-O2", "-ffp-contract=off", "-Wall", "-Wextra", "-Werror", f"-march={march}"]
    srcs = [fuzzing.CSRC / s for s in fuzzing.variant_build_sources("aarch64")]
    exe = tmp_path / "cases"
    cmd = [cc, *flags, "-I", str(fuzzing.CSRC), *map(str, srcs), str(fuzzing.CTESTS / "bitcos-kernel-cases.c")]
    r = subprocess.run([*cmd, "-lm", "-o", str(exe)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    empty = tmp_path / "none.bin"
    empty.write_bytes(np.zeros(12, "<i8").tobytes())
    r = subprocess.run([*runner, str(exe), str(empty), str(tmp_path / "out.bin")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.splitlines()[0] == f"kernels: generic portable {kernel}", r.stdout
    assert r.stderr.splitlines() == [f"BITCOS CPU kernel: {kernel}"], r.stderr
