"""`python3 -m dev.gpu_isa` (dev/gpu_isa.py, a maintainer's instrument): the ISA loop finder and classifier on made-up
AMD listings, and the real Vulkan mat-vec shaders compiled on Mesa RADV's null gfx1100 device."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dev import gpu_isa

# One hot loop (BB1..BB9) holding an inner loop of 4 trips (BB2), a divergent if (skipped by execz only when
# no lane is active: counts), a uniform if/else (BB6: 4 instructions against BB7: 1, the longer counts); a
# second top-level loop (BB11, the partial-rows copy) is not the hot one.
ISA = """\
BB0:
\ts_load_b128 s[0:3], s[4:5], 0x0                             ; f4080000 f8000000
\ts_cmp_ge_u32 s5, s6                                         ; bf090605
\ts_cbranch_scc1 BB10                                         ; bfa20010
BB1:
\tv_add_nc_u32_e32 v1, 1, v1                                  ; 4a020281
\ts_mov_b32 s7, 0                                             ; be870080
BB2:
\ts_buffer_load_b32 s8, s[0:3], s7                            ; f4000200 0e000000
\ts_add_u32 s7, s7, 1                                         ; 80078107
\ts_cmp_lt_u32 s7, 4                                          ; bf0a8407
\ts_cbranch_scc1 BB2                                          ; bfa2fffb
BB3:
\ts_and_saveexec_b32 s9, vcc_lo                               ; be89206a
\ts_cbranch_execz BB5                                         ; bfa50002
BB4:
\tglobal_load_b32 v2, v[0:1], off                             ; dc520000 027c0000
\tv_fma_f32 v3, v2, v4, v3                                    ; d6130003 040e0902
BB5:
\ts_or_b32 exec_lo, exec_lo, s9                               ; 8c7e097e
\ts_cmp_eq_u32 s10, 0                                         ; bf06800a
\ts_cbranch_scc1 BB7                                          ; bfa20004
BB6:
\tv_mul_f32_e32 v5, v5, v6                                    ; 100a0d05
\tv_mul_f32_e32 v5, v5, v6                                    ; 100a0d05
\tv_mul_f32_e32 v5, v5, v6                                    ; 100a0d05
\ts_branch BB8                                                ; bfa00001
BB7:
\tds_load_b32 v7, v8                                          ; d8d80000 07000008
BB8:
\ts_waitcnt vmcnt(0)                                          ; bf8903f7
\ts_add_u32 s5, s5, s11                                       ; 80050b05
\ts_cmp_ge_u32 s5, s6                                         ; bf090605
\ts_cbranch_scc1 BB10                                         ; bfa20001
BB9:
\ts_branch BB1                                                ; bfa0ffe6
BB10:
\ts_mov_b32 s12, 0                                            ; be8c0080
BB11:
\tv_add_nc_u32_e32 v9, 1, v9                                  ; 4a121281
\ts_add_u32 s12, s12, 1                                       ; 800c810c
\ts_cmp_lt_u32 s12, s6                                        ; bf0a060c
\ts_cbranch_scc1 BB11                                         ; bfa2fffc
BB12:
\tbuffer_store_b32 v3, v10, s[0:3], 0 offen                   ; e0680000 80000a03
\ts_endpgm                                                    ; bfb00000
"""


def test_classify_amd_opcodes():
    """Each class from its opcode family; waits and branches are control, scalar memory is not SALU."""
    assert gpu_isa.classify("v_dot4_i32_iu8") == "VALU"
    assert gpu_isa.classify("v_readfirstlane_b32") == "VALU"
    assert gpu_isa.classify("s_bcnt1_i32_b32") == "SALU"
    assert gpu_isa.classify("s_load_b64") == "SMEM" and gpu_isa.classify("s_buffer_load_b32") == "SMEM"
    assert gpu_isa.classify("buffer_load_u16") == "VMEM" and gpu_isa.classify("global_load_b128") == "VMEM"
    assert gpu_isa.classify("ds_bpermute_b32") == "LDS"
    for op in ("s_waitcnt", "s_cbranch_execz", "s_branch", "s_delay_alu", "s_endpgm", "s_clause"):
        assert gpu_isa.classify(op) == "control"


def test_hot_loop_of_a_made_up_listing():
    """The loop loading most is the hot one; an iteration counts its inner loop 4 times, both arms of the
    divergent if, the longer arm of the uniform if/else (counted by hand: 34 instructions)."""
    loop = gpu_isa.hot_loop(ISA, [4])
    assert loop.label == "BB1" and loop.depth == 1 and loop.top_level_loops == 2
    assert dict(loop.per_iteration) == {"VALU": 5, "SALU": 14, "SMEM": 4, "VMEM": 1, "control": 10}
    # the uniform arm's choice: the longer (BB6, 3 VALU) and not BB7's LDS load
    assert loop.per_iteration["LDS"] == 0


def test_hot_loop_is_the_one_loading_most():
    """A setup loop before the hot one (filling shared memory from constant data) is not the hot loop."""
    setup = "BB90:\n\ts_load_b32 s20, s[0:1], 0x0\n\tds_store_b32 v22, v20\n\ts_cbranch_scc1 BB90\n"
    isa = ISA.replace("BB0:\n", setup + "BB0:\n", 1)
    loop = gpu_isa.hot_loop(isa, [4])
    assert loop.label == "BB1" and loop.top_level_loops == 3
    assert sum(loop.per_iteration.values()) == 34


def test_hot_loop_needs_the_inner_trip_counts():
    """An inner loop without a trip count, or a tag naming more levels than the ISA has, is an error."""
    with pytest.raises(ValueError, match="inner loop"):
        gpu_isa.hot_loop(ISA, [])
    with pytest.raises(ValueError, match="inner-trips"):
        gpu_isa.hot_loop(ISA, [4, 2])


# A matrix multiply's hot loop (BB1..BB7) with two sibling inner loops, as mul_mm_bitcos.comp's K step holds a
# decode loop and a multiply loop: A (BB2, 5 instructions) and B (BB4..BB6), which holds C (BB5, 4
# instructions); layout order A, B, C.
ISA_SIBLINGS = """\
BB0:
\ts_mov_b32 s5, 0                                             ; be850080
BB1:
\tglobal_load_b32 v1, v[2:3], off                             ; dc520000 017c0002
\ts_mov_b32 s7, 0                                             ; be870080
BB2:
\tv_and_b32_e32 v2, v1, v3                                    ; 36040701
\tds_store_b32 v4, v2                                         ; d8340000 00000204
\ts_add_u32 s7, s7, 1                                         ; 80078107
\ts_cmp_lt_u32 s7, 4                                          ; bf0a8407
\ts_cbranch_scc1 BB2                                          ; bfa2fffb
BB3:
\ts_barrier                                                   ; bfbd0000
\ts_mov_b32 s8, 0                                             ; be880080
BB4:
\tds_load_b32 v5, v6                                          ; d8d80000 05000006
\ts_mov_b32 s9, 0                                             ; be890080
BB5:
\tv_fmac_f32_e32 v7, v5, v8                                   ; 560e1105
\ts_add_u32 s9, s9, 1                                         ; 80098109
\ts_cmp_lt_u32 s9, 2                                          ; bf0a8209
\ts_cbranch_scc1 BB5                                          ; bfa2fffc
BB6:
\ts_add_u32 s8, s8, 1                                         ; 80088108
\ts_cmp_lt_u32 s8, 8                                          ; bf0a8808
\ts_cbranch_scc1 BB4                                          ; bfa2fff7
BB7:
\ts_add_u32 s5, s5, 1                                         ; 80058105
\ts_cmp_lt_u32 s5, s6                                         ; bf0a0605
\ts_cbranch_scc1 BB1                                          ; bfa2ffed
BB8:
\tbuffer_store_b32 v7, v10, s[0:3], 0 offen                   ; e0680000 80000a07
\ts_endpgm                                                    ; bfb00000
"""


def test_sibling_inner_loops():
    """inner-trips names every inner loop of the hot loop in layout order (a loop before the loops inside it,
    siblings in order): [A, B, C] = [4, 8, 2] counts 2 + 4 x 5 + 2 + 8 x (2 + 2 x 4 + 3) + 3 = 131 (by hand);
    swapping the siblings' counts changes the total; a loop the measured case never enters takes 0."""
    loop = gpu_isa.hot_loop(ISA_SIBLINGS, [4, 8, 2])
    assert loop.label == "BB1" and loop.depth == 2 and loop.inner_loops == 3 and loop.top_level_loops == 1
    assert dict(loop.per_iteration) == {"VMEM": 1, "VALU": 20, "LDS": 12, "SALU": 68, "control": 30}
    assert sum(gpu_isa.hot_loop(ISA_SIBLINGS, [8, 4, 2]).per_iteration.values()) == 2 + 40 + 2 + 4 * 13 + 3
    assert sum(gpu_isa.hot_loop(ISA_SIBLINGS, [0, 8, 2]).per_iteration.values()) == 131 - 4 * 5
    blocks = gpu_isa.parse_isa(ISA_SIBLINGS)
    (hot,) = gpu_isa.find_loops(blocks)
    assert [blocks[c.header].label for c in gpu_isa.inner_loops(hot)] == ["BB2", "BB4", "BB5"]
    # a tag written for a chain of two nested loops does not fit three loops
    with pytest.raises(ValueError, match="3 inner loop"):
        gpu_isa.hot_loop(ISA_SIBLINGS, [4, 8])


def test_matmul_shape_tags(tmp_path: Path):
    """A matrix multiply's tag: weights per lane and the columns of one iteration, in the source's #defines
    (mul_mm_bitcos.comp's TM, TN, TK) or upstream's specialization constants; a mat-vec's columns: NUM_COLS."""
    src = gpu_isa.REPO_VULKAN / gpu_isa.PROMPT_BITCOS
    shape, names = gpu_isa.shader_shape(src), gpu_isa.source_defines(src)
    assert shape is not None and (names["TM"], names["TN"], names["TK"]) == (32, 32, 64)
    # the multiply loop over a step's TK weights is unrolled: no inner loop
    assert shape.evaluate(names) == (32, []) and shape.evaluate_columns(names) == 32
    up = gpu_isa.Shape.parse(gpu_isa.UPSTREAM_MM_SHAPE)
    small = dict(zip(gpu_isa.WARPTILE_NAMES, [64, 32, 32, 32, 32, 32, 2, 2, 2, 1, 64]))
    assert up.evaluate(small) == (16, []) and up.evaluate_columns(small) == 32
    assert gpu_isa.Shape.parse("weights-per-iteration = 16").evaluate_columns({"NUM_COLS": 4}) == 4
    assert gpu_isa.prompt_variant("mul_mm_bitcos_pt") == "bitcos_pt"
    assert gpu_isa.prompt_variant("matmul_quant_f32_f16acc") == "tq2_0"


def test_shape_tags():
    """A shader's gpu-isa tag, evaluated in the specialization constants."""
    shape = gpu_isa.Shape.parse("weights-per-iteration = 16 * NUM_ROWS; inner-trips = NUM_ROWS, BLOCK_SIZE / 16")
    assert shape.evaluate({"NUM_ROWS": 2, "BLOCK_SIZE": 64, "NUM_COLS": 1}) == (32, [2, 4])
    assert gpu_isa.Shape.parse(gpu_isa.UPSTREAM_SHAPES["mul_mat_vec_tq2_0.comp"]).inner_trips == []
    with pytest.raises(ValueError):
        gpu_isa.eval_expr("__import__('os')", {})
    # every BITCOS mat-vec source of the tree carries one
    for src in gpu_isa.REPO_VULKAN.glob("mul_mat_vec*.comp"):
        assert gpu_isa.shader_shape(src) is not None, f"{src.name} has no gpu-isa tag"


def test_pipelines_of_a_build_folder(tmp_path: Path):
    """A build's SPIR-V names tell each BITCOS pipeline's shader (a second shader's suffix ends its type) and
    its variant (the suffix taken off); the f16-activation and non-mat-vec files are not mat-vec pipelines."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "mul_mat_vec_bitcos.comp").write_text("// gpu-isa: weights-per-iteration = 16 * NUM_ROWS\n")
    (src / "mul_mat_vec_bitcos_fast.comp").write_text("// gpu-isa: weights-per-iteration = 32 * NUM_ROWS\n")
    spv = tmp_path / "spv"
    spv.mkdir()
    for name in (
        "mul_mat_vec_bitcos_f32_f32_subgroup_no_shmem",
        "mul_mat_vec_id_bitcos_g128_fast_f32_f32",
        "mul_mat_vec_bitcos_fast_f32_f32_subgroup",
        "mul_mat_vec_tq2_0_f32_f32",
        "mul_mat_vec_q4_0_f32_f32",
        "mul_mm_bitcos",
    ):
        (spv / f"{name}.spv").write_bytes(b"")
    got = {
        p.name: (p.source, p.variant, p.shape.weights if p.shape else None)
        for p in gpu_isa.build_dir_shaders(spv, sorted(src.iterdir()))
    }
    assert got == {
        "mul_mat_vec_bitcos_f32_f32_subgroup_no_shmem": ("mul_mat_vec_bitcos.comp", "bitcos", "16 * NUM_ROWS"),
        "mul_mat_vec_id_bitcos_g128_fast_f32_f32": ("mul_mat_vec_bitcos_fast.comp", "bitcos_g128", "32 * NUM_ROWS"),
        "mul_mat_vec_bitcos_fast_f32_f32_subgroup": ("mul_mat_vec_bitcos_fast.comp", "bitcos", "32 * NUM_ROWS"),
        "mul_mat_vec_tq2_0_f32_f32": ("mul_mat_vec_tq2_0.comp", "tq2_0", "16 * NUM_ROWS"),
    }
    assert [gpu_isa.reduction_of(n) for n in sorted(got)] == ["subgroup", "hybrid", "shmem", "shmem"]


def test_budget_arithmetic():
    """Lane-instructions per second over weights per second at full bandwidth, e.g. an H200-like part:
    16896 lanes x 1.98 GHz over 4.8 TB/s at 1.6 bits per weight = 1.39; and every datasheet entry is complete,
    int8 dot support with its sources included."""
    gpu = {"alu_lanes": 16896, "clock_ghz": 1.98, "bandwidth_gbs": 4800}
    assert gpu_isa.budget(gpu, 1.6) == pytest.approx(16896 * 1.98e9 / (4800e9 * 8 / 1.6))
    assert gpu_isa.budget(gpu, 1.6) == pytest.approx(1.394, abs=1e-3)
    for g in gpu_isa.load_datasheets():
        assert g["proxy"] in gpu_isa.FAMILIES and g["sources"] and g["alu_lanes"] > 0
        assert isinstance(g["int8_dot_accelerated"], bool) and g["int8_dot_sources"]


def test_budget_uses_the_default_pipeline():
    """The prediction takes, of the BITCOS pipelines measured, the one the backend runs by default: the fast
    shader's q8_1 form where the GPU has accelerated int8 dot products, its f32 form elsewhere; never the exact
    shader's, nor mat-vec-id."""

    def res(name: str, source: str, cols: int = 1) -> gpu_isa.Result:
        return gpu_isa.Result(name, source, cols, 2, 64, {}, None, None)

    fast = "mul_mat_vec_bitcos_fast.comp"
    results = [
        res("mul_mat_vec_bitcos_f32_f32_subgroup_no_shmem", "mul_mat_vec_bitcos.comp"),
        res("mul_mat_vec_id_bitcos_fast_q8_1_f32_subgroup_no_shmem", fast),
        res("mul_mat_vec_bitcos_fast_f32_f32_subgroup_no_shmem", fast),
        res("mul_mat_vec_bitcos_fast_q8_1_f32_subgroup_no_shmem", fast),
        res("mul_mat_vec_bitcos_pt_fast_q8_1_f32_subgroup_no_shmem", fast),
        res("mul_mat_vec_bitcos_fast_q8_1_f32_subgroup_no_shmem", fast, cols=4),
    ]
    assert gpu_isa.default_bitcos(results, 1, True).pipeline == "mul_mat_vec_bitcos_fast_q8_1_f32_subgroup_no_shmem"
    assert gpu_isa.default_bitcos(results, 1, False).pipeline == "mul_mat_vec_bitcos_fast_f32_f32_subgroup_no_shmem"
    assert gpu_isa.default_bitcos(results, 4, True).cols == 4
    assert gpu_isa.default_bitcos(results, 4, False) is None
    assert gpu_isa.default_bitcos(results, 1, True, "bitcos_pt").pipeline.startswith("mul_mat_vec_bitcos_pt_fast_q8_1")


def _by(results: list[gpu_isa.Result], prefix: str, source: str, cols: int) -> dict:
    return next(r.as_dict() for r in results if r.pipeline.startswith(prefix) and r.source == source and r.cols == cols)


def test_real_shaders_on_the_null_device(radv_null_isa):
    """The real pipelines with ggml-vulkan's parameters for RDNA3 (workgroup 64, 2 rows, subgroup reduction).
    Checks independent of the counter: the parser sees every instruction RADV counts in the shader; and the
    activation loads the shader source implies: each row of an iteration reads 8 vec2 activations per column,
    so 3 more columns add 8 x 2 rows x 3 = 48 VMEM loads to an iteration (TQ2_0 and the exact BITCOS shader)."""
    params, results = radv_null_isa
    assert (params.subgroup_size, params.num_rows, params.reduction) == (64, 2, "subgroup")
    for r in results:
        d = r.as_dict()
        assert "error" not in d, d
        assert d["per_weight"] > 0 and d["vgprs"] > 0 and d["waves_per_simd"] > 0
    for prefix, source in (
        ("mul_mat_vec_tq2_0_f32_f32", "mul_mat_vec_tq2_0.comp"),
        ("mul_mat_vec_bitcos_f32_f32", "mul_mat_vec_bitcos.comp"),
    ):
        one, four = _by(results, prefix, source, 1), _by(results, prefix, source, 4)
        assert four["hot_loop_by_class"]["VMEM"] - one["hot_loop_by_class"]["VMEM"] == 8 * 2 * 3
        assert four["per_weight_and_column"] < one["per_weight_and_column"]


def test_instruction_count_matches_radv(radv_null_isa, tmp_path: Path):
    """RADV's own "Instructions" statistic of a pipeline equals the instructions parse_isa finds in its ISA."""
    params, results = radv_null_isa
    pipelines = [
        p
        for p in gpu_isa.compile_shaders(gpu_isa.shader_tree(), {"subgroup"})
        if p.name == "mul_mat_vec_tq2_0_f32_f32_subgroup_no_shmem"
    ]
    _, res = gpu_isa.measure("gfx1100", pipelines, (1,), keep=tmp_path)
    isa = next(tmp_path.glob("gfx1100/*.Assembly.txt")).read_text()
    assert sum(len(b.ops) for b in gpu_isa.parse_isa(isa)) == res[0].stats["Instructions"]


def test_tq2_spirv_is_the_builds(radv_null_isa):
    """The generator built here compiles upstream's TQ2_0 mat-vec to the same SPIR-V as the project's Vulkan
    build (when its build folder is in the cache)."""
    from ggml_bitcos import upstream

    spv_dir = upstream.cache_dir() / "build/vendor/llama.cpp/ggml/src/ggml-vulkan/vulkan-shaders.spv"
    if not spv_dir.is_dir():
        pytest.skip(f"no Vulkan build in {spv_dir}")
    ours = {p.name: p for p in gpu_isa.compile_shaders(gpu_isa.shader_tree(), {"subgroup"}) if "tq2_0" in p.name}
    assert ours
    for name, p in ours.items():
        assert p.spv.read_bytes() == (spv_dir / f"{name}.spv").read_bytes(), name


def test_cli_json(radv_null_isa, capsys):
    """`dev.gpu_isa --json` prints one {"family", "cols", "bitcos", "tq2_0"} object per column count, with
    the device's int8 dot support and the BITCOS pipeline the backend runs by default there."""
    assert gpu_isa.main(["--families", "gfx1100", "--cols", "1", "--types", "tq2_0,bitcos", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["family"], r["cols"]) for r in rows] == [("gfx1100", 1)]
    assert rows[0]["tq2_0"]["per_weight"] > 0
    assert any(k.startswith("mul_mat_vec_bitcos.comp:") for k in rows[0]["bitcos"])
    # RADV reports accelerated int8 dot products on gfx1100, where the backend runs the fast shader's q8_1 form
    assert rows[0]["int8_dot_accelerated"] is True
    assert rows[0]["bitcos_default"] in rows[0]["bitcos"] and "_fast_q8_1_f32" in rows[0]["bitcos_default"]


def _fma_count(blocks: list, loop) -> int:
    """Multiply-adds in a loop's body (v_fma_mixlo / mixhi_f16 convert to f16 with a scale: TQ2_0's decode)."""
    fma = [op for bi in loop.body for op in blocks[bi].ops if op.startswith(("v_fma", "v_fmac"))]
    return sum(not op.startswith(("v_fma_mixlo", "v_fma_mixhi")) for op in fma)


def test_prompt_path_on_the_null_device(radv_null_isa, tmp_path: Path):
    """`--prompt`: mul_mm_bitcos.comp and upstream's TQ2_0 matmul compiled for gfx1100 with ggml-vulkan's
    parameters. Checks independent of the counter: the multiply-adds in the ISA match the tags: BITCOS's hot
    loop (no inner loop: the multiply loop over TK = 64 is unrolled) holds 16 x 64 = 1024 FMAs (a thread's 4 x 4
    outputs per k) = 32 weights x 32 columns a lane covers per K step; upstream's small tile's hot loop (no
    inner loop) holds 512 f16 FMAs = 16 x 32 (its f16 accumulators; its 16 v_fma_mix*_f16 are the decode's
    scale)."""
    ((_, params, results),) = gpu_isa.run_prompt(["gfx1100"], keep=tmp_path)
    by = {r.pipeline: r for r in results}
    assert {"mul_mm_bitcos", "mul_mm_bitcos_pt", "mul_mm_bitcos_g128"} <= set(by)
    assert {f"{n}_aligned_{i}" for n in gpu_isa.UPSTREAM_MM for i in (0, 1)} <= set(by)
    for r in results:
        d = r.as_dict()
        assert "error" not in d, d
        assert d["per_weight_and_column"] > 0 and d["vgprs"] > 0 and d["waves_per_simd"] > 0
    bitcos, tq2 = by["mul_mm_bitcos"], by["matmul_quant_f32_f16acc_aligned_0"]
    assert (bitcos.weights_per_iteration, bitcos.cols, bitcos.loop.inner_loops) == (32, 32, 0)
    assert (tq2.weights_per_iteration, tq2.cols, tq2.loop.inner_loops) == (16, 32, 0)
    blocks = gpu_isa.parse_isa((tmp_path / "gfx1100" / "mul_mm_bitcos.mul_mm_bitcos.Assembly.txt").read_text())
    hot = next(lp for lp in gpu_isa.find_loops(blocks) if blocks[lp.header].label == bitcos.loop.label)
    assert _fma_count(blocks, hot) == 32 * 32
    name = "mul_mm.matmul_quant_f32_f16acc_aligned_0.Assembly.txt"
    blocks = gpu_isa.parse_isa((tmp_path / "gfx1100" / name).read_text())
    hot = next(lp for lp in gpu_isa.find_loops(blocks) if blocks[lp.header].label == tq2.loop.label)
    assert _fma_count(blocks, hot) == 16 * 32


def test_cli_prompt_json(radv_null_isa, capsys):
    """`dev.gpu_isa --prompt --json` prints one {"family", "kind": "prompt", "bitcos", "tq2_0"} object per
    family, counts per multiply-add under per_weight_and_column."""
    assert gpu_isa.main(["--prompt", "--families", "gfx1100", "--types", "bitcos,tq2_0", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["family"], row["kind"]) == ("gfx1100", "prompt")
    assert list(row["bitcos"]) == ["mul_mm_bitcos.comp:mul_mm_bitcos"]
    assert row["tq2_0_default"] in row["tq2_0"]
    assert all(d["per_weight_and_column"] > 0 for d in (*row["bitcos"].values(), *row["tq2_0"].values()))
