"""BITCOS on ggml-vulkan, on whatever Vulkan device the machine has (CI and the dev VMs: Mesa's lavapipe).

Needs the patched llama.cpp built with `CMAKE_ARGS="-DGGML_VULKAN=ON" ./scripts/install.sh`. Without a
Vulkan build or device these tests skip, except under BITCOS_REQUIRE_VULKAN=1 (set by .ci/run), where that
is a failure. The device is chosen as llama.cpp documents it: GGML_VK_VISIBLE_DEVICES (default here: 0;
lavapipe is a CPU-type device, which ggml-vulkan only uses when named).

Three mat-vec forms (FORMS): the fast shader (mul_mat_vec_bitcos_fast.comp, the default) with f32 activations
or with q8_1 activations and packed int8 dot products (the default where the device accelerates them; forced
here with GGML_BITCOS_VULKAN_INT8, lavapipe's are not accelerated), and the exact one (mul_mat_vec_bitcos.comp,
TQ2_0's arithmetic, GGML_BITCOS_VULKAN_EXACT=1). The op-level test runs all three; the end-to-end tests that
assert bit identity with TQ2_0 (and those sharing their models and expectations) run the exact one,
test_offloaded_decode_fast_close_to_tq2_0 and test_offloaded_decode_q8_1_close_to_tq2_0 the fast ones.

- op level: llama_cpp/bin/test-bitcos-backend (tests/c/test-bitcos-backend.c): BITCOS MUL_MAT / MUL_MAT_ID on
  the device against the CPU backend (NMSE <= 5e-4) and against TQ2_0 on the same device (exact shader: bit for
  bit; fast shader, both forms: NMSE <= 5e-4), every variant of format versions 1 and 2;
- end to end: tiny dense and MoE models, TQ2_0 source vs its BITCOS conversion (version 1: G128, PT; version
  2: B256, MATRIX), both offloaded: with the exact shader identical greedy tokens and logits, with the fast
  one the same first 8 tokens and logits within a bound; BITCOS offloaded vs BITCOS on the CPU:
  same first tokens, logits close (also a version-2 MATRIX model whose rows end in partial 128-weight units);
  partial offload and --no-mmap; the device memory of the weights, BITCOS vs TQ2_0.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ggml_bitcos import llama_run
from ggml_bitcos.format import BITCOS_TYPE_IDS, COMPANION_SUFFIX, TYPE_ID_BITMAP
from gpu_offload import PROMPT, LazyModels, backend_bin, generate
import llama_helpers

N_TOKENS = 32


# the BITCOS mat-vec forms: their environment, and what the backend logs when it creates the device
FORMS = {
    "exact": ({"GGML_BITCOS_VULKAN_EXACT": "1"}, "TQ2_0-exact shader"),
    "fast-f32": ({"GGML_BITCOS_VULKAN_INT8": "0"}, "f32 activations"),
    "fast-q8_1": ({"GGML_BITCOS_VULKAN_INT8": "1"}, "q8_1 activations, packed int8 dot products"),
}


def _vulkan_env(form: str = "exact") -> dict[str, str]:
    """The environment of a run on the Vulkan device with BITCOS mat-vecs in `form` (FORMS)."""
    env = dict(os.environ)
    env.setdefault("GGML_VK_VISIBLE_DEVICES", "0")
    env.pop("GGML_BITCOS_VULKAN_EXACT", None)
    env.pop("GGML_BITCOS_VULKAN_INT8", None)
    env.update(FORMS[form][0])
    return env


@pytest.fixture(scope="session")
def vulkan_build(patched_llama) -> Path:
    """llama_cpp/bin of a patched build with the Vulkan backend and a usable device (GGML_VK_VISIBLE_DEVICES=0);
    skips (or fails under BITCOS_REQUIRE_VULKAN=1) otherwise."""
    return backend_bin("vulkan", "Vulkan0", "BITCOS_REQUIRE_VULKAN", env=_vulkan_env())


@pytest.mark.parametrize("form", list(FORMS))
def test_op_level_against_cpu_and_tq2_0(vulkan_build: Path, form: str) -> None:
    r = subprocess.run(
        [str(vulkan_build / "test-bitcos-backend"), "Vulkan0"],
        env=_vulkan_env(form),
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-6000:]
    # the device ran the form asked for (the q8_1 one needs the device's integer dot product feature)
    assert f": {FORMS[form][1]}" in r.stdout + r.stderr, (r.stdout + r.stderr)[:3000]
    assert ("bit for bit (exact shader)" in r.stdout) == (form == "exact"), r.stdout[:2000]
    m = re.search(r"(\d+) checks, 0 failures", r.stdout)
    assert m and int(m.group(1)) > 200, r.stdout[-2000:]
    # the device runs every variant, version 2's too: none skipped for want of support
    assert "skipped" not in r.stdout, r.stdout[-3000:]


def _generate(
    model: Path,
    out: Path,
    ngl: int,
    n_tokens: int = N_TOKENS,
    mmap: bool = True,
    prompt: str = PROMPT,
    form: str = "exact",
) -> tuple[np.ndarray, np.ndarray, str]:
    """gpu_offload.generate on the Vulkan device (lavapipe in CI) with BITCOS mat-vecs in `form` (FORMS)."""
    return generate(model, out, ngl, n_tokens, prompt=prompt, mmap=mmap, env=_vulkan_env(form))


@pytest.fixture(scope="session")
def vk_models(tmp_path_factory, vulkan_build) -> dict[str, tuple[Path, Path]]:
    """(source, BITCOS conversion) per gpu_offload.GPU_MODELS entry, built on first use."""
    return LazyModels(tmp_path_factory.mktemp("vk"))


def _weight_types(model: Path) -> set[int]:
    """ggml type ids of the model's 2-D / 3-D tensors."""
    from gguf import GGUFReader

    return {int(t.tensor_type) for t in GGUFReader(model).tensors if len(t.shape) >= 2}


TQ2_0_PAIRS = ["dense-g128", "dense-pt", "moe-g128", "dense-b256", "dense-matrix", "moe-b256"]


def test_v2_models_hold_version_2_weights(vk_models) -> None:
    """The version-2 conversions really are version 2 (type BITCOS), the version-1 ones version 1."""
    for name in ("dense-b256", "dense-matrix", "dense-matrix-k288"):
        assert TYPE_ID_BITMAP in _weight_types(vk_models[name][1]), name
    for name in ("dense-g128", "dense-pt"):
        assert TYPE_ID_BITMAP not in _weight_types(vk_models[name][1]), name


@pytest.mark.parametrize("name", TQ2_0_PAIRS)
def test_offloaded_decode_identical_to_tq2_0(vk_models, tmp_path: Path, name: str) -> None:
    """With a one-token prompt every matmul is a mat-vec (MUL_MAT and MUL_MAT_ID with one column), where the
    exact BITCOS shader mirrors TQ2_0's arithmetic: the same tokens and bit-identical logits on the device
    (version 2 B256 and MATRIX as version 1 G128 and PT)."""
    src, out = vk_models[name]
    t_src, l_src, _ = _generate(src, tmp_path / "a.npz", ngl=-1, prompt="")
    t_out, l_out, log_out = _generate(out, tmp_path / "b.npz", ngl=-1, prompt="")
    assert "Vulkan0" in log_out and "offloaded 3/3 layers" in log_out, log_out[-3000:]
    assert t_src.tolist() == t_out.tolist()
    assert np.array_equal(l_src, l_out), f"max |logit diff| {float(np.abs(l_src - l_out).max())}"
    assert len(set(t_src.tolist())) > 3  # not degenerate


# The fast shader's logits (f32 activations) against TQ2_0's, relative to TQ2_0's largest: its mat-vecs add the
# same f32 products in another order (and apply the scale per 32 weights or per row instead of per 256), so each
# output differs by a few ulp of its partial sums (relative ~1e-7 per mat-vec); 1e-4 leaves room for their
# growth through 3 layers and 8 steps and stays far below the 1.4e-2 the whole graph's rounding gives against the
# CPU (test_offloaded_bitcos_close_to_cpu). Measured on lavapipe: 2.1e-6 (dense MATRIX) to 2.9e-5 (MoE B256).
FAST_LOGIT_BOUND = 1e-4


@pytest.mark.parametrize("name", TQ2_0_PAIRS)
def test_offloaded_decode_fast_close_to_tq2_0(vk_models, tmp_path: Path, name: str) -> None:
    """The fast mat-vec shader with f32 activations: with a one-token prompt every matmul is a mat-vec; the
    first 8 greedy tokens are TQ2_0's, the logits of every step within FAST_LOGIT_BOUND of TQ2_0's largest."""
    src, out = vk_models[name]
    t_src, l_src, _ = _generate(src, tmp_path / "a.npz", ngl=-1, n_tokens=8, prompt="")
    t_out, l_out, log_out = _generate(out, tmp_path / "b.npz", ngl=-1, n_tokens=8, prompt="", form="fast-f32")
    assert "Vulkan0" in log_out and "offloaded 3/3 layers" in log_out, log_out[-3000:]
    assert f": {FORMS['fast-f32'][1]}" in log_out, log_out[-3000:]
    assert t_src.tolist() == t_out.tolist()
    err = float(np.abs(l_src - l_out).max()) / float(np.abs(l_src).max())
    print(json.dumps({"model": name, "fast_vs_tq2_0_max_logit_diff_rel": err}))
    assert err <= FAST_LOGIT_BOUND, err


@pytest.mark.parametrize("name", TQ2_0_PAIRS)
def test_offloaded_decode_q8_1_close_to_tq2_0(vk_models, tmp_path: Path, name: str) -> None:
    """The fast mat-vec shader with q8_1 activations rounds each activation to 8 bits of its 32-block's largest,
    as the CPU's TQ2_0 and BITCOS kernels round theirs (q8_K, per 256). Reference: TQ2_0 offloaded (f32
    activations), and the bound is the CPU's own distance from it: the first step's logits (the same input for
    all runs) no further from TQ2_0's than the CPU's TQ2_0 logits are (x1.1 + 1e-3 of the largest), and the
    greedy tokens agree with TQ2_0's for at least as many of 8 steps as the CPU's do. Measured on lavapipe:
    q8_1 0.70-0.87e-2 of the largest logit, the CPU 0.95-1.41e-2; dense G128: the CPU's tokens leave TQ2_0's
    at step 2, the q8_1 form's at step 4."""
    src, out = vk_models[name]
    t_src, l_src, _ = _generate(src, tmp_path / "a.npz", ngl=-1, n_tokens=8, prompt="")
    t_q8, l_q8, log_q8 = _generate(out, tmp_path / "b.npz", ngl=-1, n_tokens=8, prompt="", form="fast-q8_1")
    t_cpu, l_cpu, _ = _generate(src, tmp_path / "c.npz", ngl=0, n_tokens=8, prompt="")
    assert "Vulkan0" in log_q8 and "offloaded 3/3 layers" in log_q8, log_q8[-3000:]
    assert f": {FORMS['fast-q8_1'][1]}" in log_q8, log_q8[-3000:]
    scale = float(np.abs(l_src[0]).max())
    err_q8, err_cpu = (float(np.abs(logits[0] - l_src[0]).max()) / scale for logits in (l_q8, l_cpu))
    same_q8 = llama_helpers.common_prefix(t_src.tolist(), t_q8.tolist())
    same_cpu = llama_helpers.common_prefix(t_src.tolist(), t_cpu.tolist())
    print(
        json.dumps(
            {
                "model": name,
                "q8_1_vs_tq2_0": err_q8,
                "cpu_vs_tq2_0": err_cpu,
                "tokens_q8_1": same_q8,
                "tokens_cpu": same_cpu,
            }
        )
    )
    assert err_q8 <= 1.1 * err_cpu + 1e-3, (err_q8, err_cpu)
    assert same_q8 >= same_cpu, (t_src.tolist(), t_q8.tolist(), t_cpu.tolist())


def test_fast_shader_nibble_table() -> None:
    """The fast shader's decode table (csrc/vulkan/bitcos_nibble_codes.glsl) is what its generator writes, and
    each entry decodes as FORMAT.md says: weight i present -> the sign of the (number of present weights before
    it)-th sign bit, absent -> 0 (checked here by numpy, independently of the generator)."""
    import importlib.util

    repo = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("vulkan_nibble_codes", repo / "scripts" / "vulkan_nibble_codes.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    text = (repo / "csrc" / "vulkan" / "bitcos_nibble_codes.glsl").read_text()
    assert text == gen.render()
    table = np.array([[float(v) for v in m.split(",")] for m in re.findall(r"vec4\(([^()]*)\)", text)])
    assert table.shape == (256, 4)
    idx = np.arange(256)
    present = (idx[:, None] >> np.arange(4)) & 1
    rank = np.cumsum(present, axis=1) - present  # present weights before weight i
    negative = (idx[:, None] >> (4 + rank)) & 1
    assert np.array_equal(table, present * (1 - 2 * negative))


@pytest.mark.parametrize("name", TQ2_0_PAIRS)
def test_offloaded_prompt_close_to_tq2_0(vk_models, tmp_path: Path, name: str) -> None:
    """A 16-token prompt takes TQ2_0 through ggml-vulkan's matrix-multiply path (fp16 tiles on lavapipe) but
    BITCOS through its tiled fp32 matmul (mul_mm_bitcos.comp), so the prompt's logits, and the KV cache,
    round differently. Bound: the first 8 tokens identical, and against the CPU (where BITCOS and TQ2_0 are
    bit-identical) the offloaded BITCOS prompt logits are no further off than the offloaded TQ2_0 ones.
    (Both differ from the CPU by ~1.4e-2 of the largest logit on lavapipe: the other ops round differently.)"""
    src, out = vk_models[name]
    t_src, l_src, _ = _generate(src, tmp_path / "a.npz", ngl=-1, n_tokens=8)
    t_out, l_out, _ = _generate(out, tmp_path / "b.npz", ngl=-1, n_tokens=8)
    _, l_cpu, _ = _generate(src, tmp_path / "c.npz", ngl=0, n_tokens=1)
    assert t_src.tolist() == t_out.tolist()
    scale = float(np.abs(l_cpu[0]).max())
    err_tq2, err_bitcos = (float(np.abs(logits[0] - l_cpu[0]).max()) for logits in (l_src, l_out))
    assert err_bitcos <= 1.1 * err_tq2 + 1e-3 * scale, (err_bitcos, err_tq2, scale)


@pytest.mark.parametrize("name", ["dense-pt", "moe-g128", "dense-matrix", "moe-b256", "dense-matrix-k288"])
def test_offloaded_bitcos_close_to_cpu(vk_models, tmp_path: Path, name: str) -> None:
    """Offloaded vs on the CPU: every op of the graph rounds differently on the device (on lavapipe, for these
    seed-11 models, both TQ2_0 and BITCOS prompt logits differ from the CPU's by 1.35-1.55e-2 of the largest
    logit, measured 2026-11-30; the seed-7 models of test_e2e give 1.7-3.1e-2 and a token flip at step 4
    for TQ2_0 too), so: the first 4 tokens identical, the prompt's logits within 2e-2 of the largest.
    Every BITCOS weight is in the device's buffer (a backend refusing its type would leave it on the CPU)."""
    _, out = vk_models[name]
    t_gpu, l_gpu, log = _generate(out, tmp_path / "gpu.npz", ngl=-1, n_tokens=4)
    assert "offloaded 3/3 layers" in log, log[-3000:]
    cpu = sum(float(m) for m in re.findall(r"CPU_Mapped model buffer size =\s*([0-9.]+) MiB", log))
    embd, bitcos = _file_mib(out, "token_embd.weight"), _bitcos_mib(out)
    assert cpu <= embd + bitcos / 2, (cpu, embd, bitcos)  # the CPU keeps the embeddings, no BITCOS weight
    t_cpu, l_cpu, _ = _generate(out, tmp_path / "cpu.npz", ngl=0, n_tokens=4)
    assert t_gpu.tolist() == t_cpu.tolist()
    assert float(np.abs(l_gpu[0] - l_cpu[0]).max()) <= 2e-2 * float(np.abs(l_cpu[0]).max())


@pytest.mark.parametrize("name", ["moe-g128", "moe-b256"])
def test_partial_offload_and_no_mmap(vk_models, tmp_path: Path, name: str) -> None:
    """One of two layers on the device (the other, with its BITCOS weights, on the CPU), and weights read
    into buffers instead of mmap: the same tokens as the TQ2_0 source offloaded the same way."""
    src, out = vk_models[name]
    t_src, _, _ = _generate(src, tmp_path / "a.npz", ngl=1, n_tokens=16, mmap=False)
    t_out, _, log = _generate(out, tmp_path / "b.npz", ngl=1, n_tokens=16, mmap=False)
    assert "offloaded 1/3 layers" in log, log[-3000:]
    assert t_src.tolist() == t_out.tolist()


def _bitcos_mib(model: Path) -> float:
    """MiB of the model's BITCOS weights and their companions in the file (all in layers)."""
    from gguf import GGUFReader

    return (
        sum(
            int(t.n_bytes)
            for t in GGUFReader(model).tensors
            if int(t.tensor_type) in BITCOS_TYPE_IDS or t.name.endswith(COMPANION_SUFFIX)
        )
        / 2**20
    )


def _file_mib(model: Path, name: str) -> float:
    from gguf import GGUFReader

    return sum(int(t.n_bytes) for t in GGUFReader(model).tensors if t.name == name) / 2**20


def _device_model_bytes(log: str) -> float:
    sizes = [float(m) for m in re.findall(r"Vulkan0 model buffer size =\s*([0-9.]+) MiB", log)]
    assert sizes, log[-3000:]
    return sum(sizes)


def test_device_memory_bitcos_vs_tq2_0(vk_models, tmp_path: Path) -> None:
    """The capacity win on the device: the offloaded BITCOS weights take less memory than TQ2_0's (tiny model:
    its F32 norms and F16 output matrix dilute the ratio; docs/PERFORMANCE.md has the bitnet-2b figure)."""
    src, out = vk_models["dense-pt"]
    _, _, log_src = _generate(src, tmp_path / "a.npz", ngl=-1, n_tokens=1)
    _, _, log_out = _generate(out, tmp_path / "b.npz", ngl=-1, n_tokens=1)
    a, b = _device_model_bytes(log_src), _device_model_bytes(log_out)
    print(json.dumps({"device_MiB_tq2_0": a, "device_MiB_bitcos": b, "ratio": b / a}))
    assert b < a


def test_bench_gpu_smoke(vulkan_build: Path, tmp_path: Path) -> None:
    """`ggml-bitcos bench gpu` runs end to end on the device (tiny shapes; the numbers mean nothing here)."""
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "ggml_bitcos",
            "bench",
            "gpu",
            "--shapes",
            "256x1024",
            "--z",
            "0.4",
            "--reps",
            "2",
            "--copy-mib",
            "8",
            "--no-e2e",
            "--json",
            str(tmp_path / "gpu.json"),
        ],
        env=_vulkan_env(),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "| tq2_0 | - |" in r.stdout and "| bitcos | 0.40 |" in r.stdout, r.stdout
    data = json.loads((tmp_path / "gpu.json").read_text())
    sums = {rec["type"]: rec["checksum"] for rec in data["matvec"]}
    assert data["copy"]["gb_per_s"] > 0 and len(sums) == 2


def test_tools_offloaded(vk_models, monkeypatch: pytest.MonkeyPatch) -> None:
    """llama-perplexity, llama-server and llama-bench with -ngl 99 on BITCOS weights: the same perplexity as
    the TQ2_0 source offloaded (to the rounding of the batched path), a chat completion, a bench row."""
    monkeypatch.setenv("GGML_VK_VISIBLE_DEVICES", os.environ.get("GGML_VK_VISIBLE_DEVICES", "0"))
    src, out = vk_models["dense-pt"]
    text = Path(__file__).parent / "data" / "ppl.txt"
    ppl_src, _ = llama_helpers.run_perplexity(src, text, ctx=128, extra=["-ngl", "99"])
    ppl_out, _ = llama_helpers.run_perplexity(out, text, ctx=128, extra=["-ngl", "99"])
    assert abs(ppl_out - ppl_src) <= 1e-2 * ppl_src, (ppl_src, ppl_out)
    with llama_run.LlamaServer(out, extra=["--chat-template", "chatml", "-ngl", "99"]) as srv:
        reply = srv.chat("Hello", max_tokens=8)
    assert reply["choices"][0]["message"]["content"] is not None
    rows = llama_run.run_bench([src, out], n_prompt=32, n_gen=4, repetitions=1, extra=["-ngl", "99"])
    assert {r["model_type"].split()[-1] for r in rows} >= {"ternary"} and all(r["n_gpu_layers"] == 99 for r in rows)
    assert any("BITCOS_PT" in r["model_type"] for r in rows) and all(r["avg_ts"] > 0 for r in rows)


def test_bench_gpu_reference_on_another_device(vulkan_build: Path, tmp_path: Path) -> None:
    """`bench gpu --ref-device`: the TQ2_0 reference runs on a second device (how an Arc user compares
    ggml-sycl's BITCOS with ggml-vulkan's TQ2_0); here BITCOS on the Vulkan device, TQ2_0 on the CPU, each
    record tagged with the device it ran on, the same weights' results on both (checksums of one column)."""
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "ggml_bitcos",
            "bench",
            "gpu",
            "--shapes",
            "128x512",
            "--z",
            "0.4",
            "--reps",
            "2",
            "--copy-mib",
            "8",
            "--no-e2e",
            "--ref-device",
            "CPU",
            "--json",
            str(tmp_path / "gpu.json"),
        ],
        env=_vulkan_env(),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads((tmp_path / "gpu.json").read_text())
    devices = {rec["type"]: rec["device"] for rec in data["matvec"]}
    assert devices == {"tq2_0": "CPU", "bitcos": "Vulkan0"}, devices
    assert "| tq2_0 | - |" in r.stdout and "| bitcos | 0.40 |" in r.stdout
