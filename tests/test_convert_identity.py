"""The converter's output, byte for byte: a fixed set of inputs made deterministically (make_model with fixed
seeds; foreign-type files written by tests/foreign_gguf.py) run through ``ggml-bitcos convert`` in the modes
and options that change what it writes, and each output's sha256 compared with the one recorded here.

The recorded digests are the converter's output as it was before its passes were restructured (commit
8cdd993); any change to the bytes a conversion writes, for the same input and options, fails here. When a
format change is meant to change them, the new digests are recorded deliberately, with the reason in the
commit. Each input's digest is checked first, so a change in the generators is told apart from one in the
converter. ``stats --json --tensors`` is pinned the same way (its numbers, the path left out).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from foreign_gguf import TYPE_ID, _kv_string, quantize_i2_s, quantize_q2_0_g128, ternary_floats, write_raw
from ggml_bitcos import foreign
from ggml_bitcos import convert_cli, stats
from ggml_bitcos.ternary import random_codes

# input name -> model_factory arguments (every one the tiny preset with a fixed seed)
MODELS: dict[str, dict] = {
    "tq2_tensor": dict(src_type="tq2_0", scale="tensor", seed=11),
    "tq2_row": dict(src_type="tq2_0", scale="row", seed=12),
    "tq2_g": dict(src_type="tq2_0", scale="g128", seed=13),  # per 256: TQ2_0's own group
    "tq1_tensor": dict(src_type="tq1_0", scale="tensor", seed=14),
    "tq1_sparse_low": dict(src_type="tq1_0", scale="tensor", z=0.1, seed=15),  # BITCOS would grow it
    "f16_g128": dict(src_type="f16", scale="g128", seed=16),
    "f16_row": dict(src_type="f16", scale="row", seed=17),
    "moe_tq2": dict(src_type="tq2_0", scale="tensor", moe=4, seed=18),
    # K = 576 (SmolLM2's width): F16 rows that only version 2 stores; the ffn_down (K 768) stays TQ2_0
    "odd_k": dict(src_type="tq2_0", scale="row", seed=19, n_embd=576, n_head=9, n_head_kv=3),
}

FOREIGN_SHAPES = {
    "blk.0.attn_q.weight": (384, 8),
    "blk.0.ffn_up_exps.weight": (256, 4, 2),
    "blk.1.attn_k.weight": (128, 4),
}


def _foreign_source(path: Path, fmt: str) -> Path:
    """A small foreign-type file: a norm and three ternary weights (2-D and 3-D) in ``fmt``."""
    rng = np.random.default_rng([21, TYPE_ID[fmt.split(":")[0]]])
    kv = _kv_string("general.architecture", "llama") + _kv_string("general.name", f"identity {fmt}")
    tensors = [("blk.0.attn_norm.weight", (384,), TYPE_ID["F32"], np.ones(384, dtype="<f4").tobytes())]
    for name, ne in FOREIGN_SHAPES.items():
        k, rows = ne[0], math.prod(ne[1:])
        if fmt.startswith("I2_S"):
            raw = quantize_i2_s(ternary_floats(rng, rows, k, 0.4, 0.0625), fmt.split(":")[1])
            tensors.append((name, ne, TYPE_ID["I2_S"], raw))
        elif fmt == "Q2_0:g128":
            tensors.append((name, ne, TYPE_ID["Q2_0"], quantize_q2_0_g128(ternary_floats(rng, rows, k, 0.4, 0.03))))
        else:
            codes = random_codes(rng, (rows, k), 0.4)
            d = rng.uniform(0.01, 0.1, (rows, k // 128)).astype(np.float16)
            if fmt == "Q2_0":
                raw = foreign.q2_0_encode(codes, np.repeat(d, 2, axis=1))
            elif fmt == "PQ2_0":
                raw = foreign.pq2_0_encode(codes, d)
            else:
                raw = foreign.ptq1_0_encode(codes, d)
            tensors.append((name, ne, TYPE_ID[fmt], raw.tobytes()))
    return write_raw(path, 2, kv, tensors)


FOREIGN = ["I2_S:x86", "I2_S:arm", "Q2_0", "Q2_0:g128", "PQ2_0", "PTQ1_0"]

INPUT_SHA256 = {
    "tq2_tensor": "a464ce9504ed1a5f2f9e3f553a85bc52b28723a7105c6d2fe6b0b3de2eeb1cd8",
    "tq2_row": "9bdd1381288e928c379cc92927b316a2caa11f779170b9a5ec085a04e261195a",
    "tq2_g": "baa83ce049422b1671ec69dd3a9a7303e44ae66a0d23bde8f74133f6ae00868f",
    "tq1_tensor": "a5c91191f543cad04570bc7802f34623264edc251e92875e96570a9cc9edf1f8",
    "tq1_sparse_low": "5303b78d1772558c2a6e57becc567b4bec7a53e389084450a7fe409b83750933",
    "f16_g128": "4fe26fd4d0e3ba924cf1186388d522730b68fa374d593da89afeb8233cd88252",
    "f16_row": "5065ad9ece7abe6307f7a3c77a69bfb52564156f07504879e3200f1a6220c24e",
    "moe_tq2": "ea12418a1f48e024b82b8c2f5b42e3e34a3a33942aca2f962e4b98316d72cfda",
    "odd_k": "4cc71180ed08454baf6707c1a0160507d72c818339a3cd727f3e6d3faf543dae",
    "I2_S:x86": "ffba6961e8997e34d9d2996bfdc35148f2304911cbc4891f352df402931fb63a",
    "I2_S:arm": "8b8433405c90c855c641b071b4202919401bfcae9b15baef731772e8d34127aa",
    "Q2_0": "4b6cd289433de38d500f1516c8679df8756388e3e49b5fa408f59e5f2c120866",
    "Q2_0:g128": "331d7cb98f463a7af7dee83b0817f7a13e674e8245171b21574c3f13c194c412",
    "PQ2_0": "1743d1c4b2d6411fb448a3921b70488be7ee29b21ef1b0c7c403a368593a7d07",
    "PTQ1_0": "42c950e102cd8ecae4b73bba0f9c946b5fb1c8d111de148778d51185ed2cd2d6",
}

# (case id, input, convert arguments after IN -o OUT; "@case" as the input: that case's output)
CASES: list[tuple[str, str, tuple[str, ...]]] = [
    ("tq2_tensor-default", "tq2_tensor", ()),
    ("tq2_tensor-v1", "tq2_tensor", ("--format-version", "1")),
    ("tq2_tensor-cache0", "tq2_tensor", ("--cache-mb", "0")),
    ("tq2_tensor-strict", "tq2_tensor", ("--strict", "--no-verify")),
    ("tq2_row-default", "tq2_row", ()),
    ("tq2_row-scale256", "tq2_row", ("--scale", "256")),
    ("tq2_g-default", "tq2_g", ()),
    ("tq2_g-v1", "tq2_g", ("--format-version", "1")),
    ("tq2_g-scale128", "tq2_g", ("--scale", "128")),
    ("tq1_tensor-default", "tq1_tensor", ()),
    ("tq1_sparse_low-default", "tq1_sparse_low", ("--allow-copy",)),
    ("tq1_sparse_low-force-grow", "tq1_sparse_low", ("--force-grow",)),
    ("f16_g128-default", "f16_g128", ()),
    ("f16_g128-v1", "f16_g128", ("--format-version", "1", "--scale", "g128")),
    ("f16_row-default", "f16_row", ()),
    ("f16_row-tensor-allow-copy", "f16_row", ("--scale", "tensor", "--allow-copy")),
    ("moe_tq2-default", "moe_tq2", ()),
    ("moe_tq2-v1", "moe_tq2", ("--format-version", "1")),
    ("odd_k-default", "odd_k", ()),
    ("odd_k-v1-allow-copy", "odd_k", ("--format-version", "1", "--allow-copy")),
    ("reconvert-allow-copy", "@tq2_tensor-v1", ("--allow-copy",)),
    ("back-tq2_0", "@tq2_tensor-default", ("--to", "tq2_0")),
    ("back-tq1_0-fallback", "@tq2_g-default", ("--to", "tq1_0", "--fallback", "f16")),
    ("back-f32", "@odd_k-default", ("--to", "f32")),
    ("back-keep", "@odd_k-default", ("--to", "tq2_0", "--fallback", "keep")),  # K 576 stays BITCOS
    ("I2_S:x86-default", "I2_S:x86", ()),
    ("I2_S:arm-layout", "I2_S:arm", ("--i2s-layout", "arm")),
    ("Q2_0-force-grow", "Q2_0", ("--force-grow",)),
    ("Q2_0-allow-copy", "Q2_0", ("--allow-copy",)),
    ("Q2_0:g128-default", "Q2_0:g128", ()),
    ("PQ2_0-default", "PQ2_0", ()),
    ("PQ2_0-v1", "PQ2_0", ("--format-version", "1")),
    ("PTQ1_0-default", "PTQ1_0", ()),
]

OUTPUT_SHA256 = {
    "tq2_tensor-default": "c248f0bfc5b480d7439b7478c7d871c6dcc73a3ef7707644ceca4aeba5081454",
    "tq2_tensor-v1": "1bf5793f2c34bdceb9a9f0298f29ac88d24c028ee87438bfb42d6f89adb97691",
    "tq2_tensor-cache0": "c248f0bfc5b480d7439b7478c7d871c6dcc73a3ef7707644ceca4aeba5081454",
    "tq2_tensor-strict": "c248f0bfc5b480d7439b7478c7d871c6dcc73a3ef7707644ceca4aeba5081454",
    "tq2_row-default": "dc06d6d92d359b1e9153fd19f9d06af3f94231348a36e3004560539d890c67de",
    "tq2_row-scale256": "26360564257c9a5d022e8c3105b14cc2e8eec62e4be32d3a225c7073117657e1",
    "tq2_g-default": "b82dbfba6432464a8dd5a6fe1f168cca5a29462f0ce57f5b0a28d89f47439b3d",
    "tq2_g-v1": "ab755c527b822969385f8f835bf5cfd1e8ce58588805013a0ec639000234036a",
    "tq2_g-scale128": "90f3f68c31c6da208c02d38dafa9971d4f1dab7fa384e39d81e185fd110226d9",
    "tq1_tensor-default": "4e44127e4be98133cdd2dbd2846d0fde8e4c4fd5f7d4e277a6511268816d6695",
    "tq1_sparse_low-default": "5303b78d1772558c2a6e57becc567b4bec7a53e389084450a7fe409b83750933",
    "tq1_sparse_low-force-grow": "70369f3f1ec5b9002a5374b228456df13d35a1fde5a03032c4ed736762bea60d",
    "f16_g128-default": "b81f2e52e207cd9931a68bd38bc3bec6014c677889a0a8cb32837a7fadc5be42",
    "f16_g128-v1": "e07d8fc1cf81d2f1352cb70da50da999da70cc4020848e0de9dbed4e6287f009",
    "f16_row-default": "e11085d719122860d454d6aa576e0b25cf13a3da2b2982b57bd9d837b41338db",
    "f16_row-tensor-allow-copy": "5065ad9ece7abe6307f7a3c77a69bfb52564156f07504879e3200f1a6220c24e",
    "moe_tq2-default": "c26b3631095e41b93b59668540ddda5c60d5d6224613c6be7883140b76bad27f",
    "moe_tq2-v1": "47b4f50d5387c61eddb54d779e7432b4981950c059abeabf7864639a4c28467c",
    "odd_k-default": "8b58aefd42b843adee52dba3324897a8081d7f4f235e12f6133c696836ef9e63",
    "odd_k-v1-allow-copy": "8ea2242cfc96d731c24da651bf9105d50ddeae0c48a4573d155081fbe80f70b5",
    "reconvert-allow-copy": "1bf5793f2c34bdceb9a9f0298f29ac88d24c028ee87438bfb42d6f89adb97691",
    "back-tq2_0": "5600823d7f6ac54418f9e24f1342faa6eae4ec9d8b9193b41780e975708c0857",
    "back-tq1_0-fallback": "4d76b0b10f3b703a9d906f0bbec64867b8c20fc85ebec525e32213d4a00bf1a6",
    "back-f32": "626a070a1ff1aefd06f9251b9ef9d9f2b1219d2eeec24fb22dbf08bd33dd5329",
    "back-keep": "cc06dc545f522eeef274766a5e9b71d3c33e3c1c5db8954b985c293fbcbe18a1",
    "I2_S:x86-default": "534db9c766771105a6c45346d8e931f59890b19b9ce8a1226056c3946ccbfc84",
    "I2_S:arm-layout": "3e39e4112dd1946dcc433e474d853513c59da1a77e09839116a6baf7e2d57b5e",
    "Q2_0-force-grow": "6b65f0bdc50e3e7d43a87ba021f120a661d0fefd5cedc4afcf31c566c8c27240",
    "Q2_0-allow-copy": "4b6cd289433de38d500f1516c8679df8756388e3e49b5fa408f59e5f2c120866",
    "Q2_0:g128-default": "470418843e679aa54079f66388501f2d113d664496921c172c476a8fa0fd0021",
    "PQ2_0-default": "6499b17fd09512ac9b9058d3b64bd4921e2d4a9c71d6515f293fd49b2a0430e7",
    "PQ2_0-v1": "6116f489b21ef70e7bc3c32f52db658a4e84ff11a3a94a7823c5baa191376db3",
    "PTQ1_0-default": "a74d16d743eaa973100a71e1961395284976dc4e8c0cf9b8d12d23cb6cc39805",
}

# stats --json --tensors of these inputs (the "path" key left out), sha256 of the canonical JSON
STATS_INPUTS = [
    "tq2_tensor",
    "tq1_sparse_low",
    "f16_g128",
    "moe_tq2",
    "odd_k",
    "I2_S:x86",
    "Q2_0:g128",
    "@tq2_g-default",
]
STATS_SHA256 = {
    "tq2_tensor": "d686cb73b8c3c0a6cd017d5813bd5644b2a82bf61688f33d1c86cf57e1039f87",
    "tq1_sparse_low": "65b7808a307829486dc245852ef29ee1d162cc15bb5c857bde81ff93bebf1e12",
    "f16_g128": "abbb3e4b1e05edba683428728d01fd2715aac9adb0717f29f9193e115766fff9",
    "moe_tq2": "d7814473e5e4cba11a0d67822896c3adcbf9ef456fa901304b231ef3ee4f731c",
    "odd_k": "5fc4d444f98d35cea916f4563db404fb048aa6ebac8cc0c636648e08ef502af6",
    "I2_S:x86": "c1d0c02c5faaf62739982824ff4926f3dc38879a2efb5e91d07a621e761fe9a7",
    "Q2_0:g128": "0938588a0ecd2319192161770ed4171246393e217369304d5db150db6c7f0834",
    "@tq2_g-default": "1a053c0294c76d10aadc764073cf19f513ea78686abcfdbaf2502f12fd4c1e1f",
}


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _run_cli(*args: str) -> tuple[int, str]:
    """``ggml-bitcos ARGS`` for the convert and stats subcommands: their own command lines, in process."""
    parser = argparse.ArgumentParser(prog="ggml-bitcos")
    sub = parser.add_subparsers(required=True)
    convert_cli.register(sub)
    stats.register(sub)
    parsed = parser.parse_args(list(args))
    err = io.StringIO()
    out = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        rc = int(parsed.func(parsed) or 0)
    return rc, out.getvalue() + err.getvalue()


@pytest.fixture(scope="module")
def identity_inputs(model_factory, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """name -> the input file (made once): a MODELS entry, a FOREIGN form, or "@case": that case's output."""
    folder = tmp_path_factory.mktemp("identity")
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            if name in MODELS:
                made[name] = model_factory(**MODELS[name])
            elif name in FOREIGN:
                made[name] = _foreign_source(folder / f"{name.replace(':', '-')}.gguf", name)
            else:
                case = name.removeprefix("@")
                _id, src, args = next(c for c in CASES if c[0] == case)
                out = folder / f"{case.replace(':', '-')}.gguf"
                rc, text = _run_cli("convert", str(get(src)), "-o", str(out), "-q", *args)
                assert rc == 0, text
                made[name] = out
        return made[name]

    return get


def _check_input(name: str, path: Path) -> None:
    if name in INPUT_SHA256:
        assert sha256(path) == INPUT_SHA256[name], f"input {name} changed: the generator, not the converter"


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_convert_output_identical(case: str, identity_inputs, tmp_path: Path) -> None:
    _id, src, args = next(c for c in CASES if c[0] == case)
    source = identity_inputs(src)
    _check_input(src, source)
    out = tmp_path / "out.gguf"
    rc, text = _run_cli("convert", str(source), "-o", str(out), "-q", *args)
    assert rc == 0, text
    assert sha256(out) == OUTPUT_SHA256[case], f"{case}: the output's bytes changed"


def stats_digest(path: Path) -> str:
    rc, text = _run_cli("stats", str(path), "--json", "--tensors")
    assert rc == 0, text
    d = json.loads(text)
    d.pop("path")
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()


@pytest.mark.parametrize("name", STATS_INPUTS)
def test_stats_identical(name: str, identity_inputs) -> None:
    source = identity_inputs(name)
    _check_input(name, source)
    assert stats_digest(source) == STATS_SHA256[name], f"stats of {name} changed"


def test_two_runs_identical(identity_inputs, tmp_path: Path) -> None:
    """The same conversion twice writes the same bytes (no time, path or ordering leaks into the file)."""
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    src = identity_inputs("moe_tq2")
    for out in (a, b):
        rc, text = _run_cli("convert", str(src), "-o", str(out), "-q", "--cache-mb", "1")
        assert rc == 0, text
    assert sha256(a) == sha256(b)
