"""gguf-py interoperability: the stock gguf-py tools read and rewrite BITCOS files without the user importing
anything (the start-up hook ``startup/_ggml_bitcos_gguf_hook.py`` installed with the package; README
"gguf-py tools on BITCOS files").

The tools run as the real console scripts in subprocesses, on files made by ``ggml-bitcos make-model`` +
``convert``; rewritten files must keep every tensor byte for byte and still run in the patched llama.cpp with
the same greedy tokens. With the hook switched off (``GGML_BITCOS_GGUF_HOOK=0``) the same commands fail as
stock gguf-py does, which shows that the hook is what makes them work.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from ggml_bitcos.format import BITCOS_TYPE_IDS, COMPANION_SUFFIX, Variant
from gguf_tools import open_gguf, tensor_bytes

from gguf_raw import read_tensor_table

ROOT = Path(__file__).resolve().parent.parent
HOOK_FILES = ("ggml_bitcos_gguf.pth", "_ggml_bitcos_gguf_hook.py")
PROMPT = "The quick brown fox jumps over the lazy dog. Once upon a time"


def _tool(name: str) -> str:
    path = shutil.which(name) or os.path.join(sysconfig.get_path("scripts"), name)
    if not os.path.exists(path):
        pytest.fail(f"{name} is not installed (gguf-py's console scripts come with PyPI gguf)")
    return path


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    # cwd outside the checkout: the subprocess sees the installed packages only, as a user's shell does
    return subprocess.run(
        cmd,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )


def _cli(cwd: Path, *args: str) -> None:
    r = _run([sys.executable, "-m", "ggml_bitcos", *args], cwd)
    assert r.returncode == 0, f"ggml-bitcos {' '.join(args)} failed:\n{r.stderr[-3000:]}"


@pytest.fixture(scope="module")
def installed_hook() -> Path:
    """The hook as installed in site-packages, identical to the checkout's (else: reinstall)."""
    site = Path(sysconfig.get_path("purelib"))
    for name in HOOK_FILES:
        inst = site / name
        if not inst.exists():
            pytest.fail(f"{inst} is missing: install the package (pip install --no-build-isolation --no-deps .)")
        if inst.read_bytes() != (ROOT / "startup" / name).read_bytes():
            pytest.fail(f"{inst} differs from startup/{name}: reinstall (pip install --no-build-isolation --no-deps .)")
    return site


@pytest.fixture(scope="module")
def bitcos_files(tmp_path_factory, installed_hook) -> dict[str, Path]:
    """TQ2_0 sources and their conversions: version 2 (MATRIX from per-matrix scales, B256 from per-256 ones;
    zero densities 0 and 1) and version 1 (PT, G128: `convert --format-version 1`)."""
    d = tmp_path_factory.mktemp("ggufpy")
    files: dict[str, Path] = {}
    for name, z, scale, extra in (
        ("pt", "0.42", "tensor", ()),
        ("g128", "0.31", "g128", ()),
        ("z0", "0", "tensor", ()),
        ("z1", "1", "g128", ()),
        ("v1pt", "0.42", "tensor", ("--format-version", "1")),
        ("v1g128", "0.31", "g128", ("--format-version", "1")),
    ):
        src = d / f"{name}-tq2_0.gguf"
        out = d / f"{name}-bitcos.gguf"
        _cli(
            d,
            "make-model",
            "-o",
            str(src),
            "--preset",
            "tiny",
            "--zero-density",
            z,
            "--type",
            "tq2_0",
            "--scale",
            scale,
            "--seed",
            "7",
            "-q",
        )
        # z = 0 on 256-wide rows: the row index makes BITCOS larger than TQ2_0, so it takes --force-grow
        _cli(d, "convert", str(src), "-o", str(out), "-q", *(["--force-grow"] if z == "0" else []), *extra)
        files[name] = out
    return files


def _tensor_map(path: Path) -> dict[str, tuple[int, bytes]]:
    return {t.name: (int(t.tensor_type), tensor_bytes(t).tobytes()) for t in open_gguf(path).tensors}


def _raw_tensor_table(path: Path) -> dict[str, tuple[int, tuple[int, ...]]]:
    """name -> (type id, ne) parsed straight from the file's bytes, without gguf-py."""
    return {n: (t.type_id, t.ne) for n, t in read_tensor_table(path).items()}


def _bitcos_type_name(type_id: int) -> str:
    """FORMAT.md §2's name of a BITCOS type id: BITCOS_G128, BITCOS_PT or (every version-2 variant) BITCOS."""
    return next(v.type_name for v in Variant if v.type_id == type_id)


def test_startup_hook_imports_nothing_heavy(installed_hook, tmp_path):
    """The .pth hook runs at every interpreter start: it must not import gguf or numpy there."""
    r = _run(
        [
            sys.executable,
            "-c",
            "import sys; print(sorted(m for m in ('gguf', 'numpy', 'gguf_tools', "
            "'ggml_bitcos') if m in sys.modules)); print(any(type(f).__name__ == 'GGUFImportHook' "
            "for f in sys.meta_path))",
        ],
        tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["[]", "True"]


@pytest.mark.parametrize(
    "first_import",
    [
        "import gguf",
        "import gguf.constants",
        "import ggml_bitcos.format",
        "import gguf_tools",
        "from ggml_bitcos.convert import convert",
    ],
)
def test_gguf_reader_without_import(bitcos_files, tmp_path, first_import):
    """gguf.GGUFReader in a plain script reads every BITCOS tensor, whatever imported gguf first (the case
    where this project's own module imports gguf half-way through its initialisation included)."""
    f = bitcos_files["pt"]
    want = {n: tt for n, (tt, _ne) in _raw_tensor_table(f).items()}
    script = (
        f"{first_import}\nimport gguf\nr = gguf.GGUFReader({str(f)!r})\n"
        "print('\\n'.join(f'{t.name} {int(t.tensor_type)} {t.tensor_type.name} {t.n_bytes}' for t in r.tensors))"
    )
    r = _run([sys.executable, "-c", script], tmp_path)
    assert r.returncode == 0, r.stderr
    got = {ln.split()[0]: (int(ln.split()[1]), ln.split()[2]) for ln in r.stdout.splitlines()}
    assert {n: tt for n, (tt, _name) in got.items()} == want
    assert {name for tt, name in got.values() if tt in BITCOS_TYPE_IDS} == {"BITCOS"}  # version 2: type 162
    assert r.stderr == ""


def test_gguf_imported_before_the_hook_installs(bitcos_files, tmp_path):
    """gguf already imported when install() runs (e.g. by an earlier .pth file): it registers at once."""
    script = (
        "import os, gguf\nassert 160 not in gguf.GGMLQuantizationType._value2member_map_\n"
        "import _ggml_bitcos_gguf_hook as h\nos.environ['GGML_BITCOS_GGUF_HOOK'] = '1'\nh.install()\n"
        f"r = gguf.GGUFReader({str(bitcos_files['v1g128'])!r})\n"
        "print(sorted({t.tensor_type.name for t in r.tensors if int(t.tensor_type) >= 160}))"
    )
    r = _run([sys.executable, "-c", script], tmp_path, env={"GGML_BITCOS_GGUF_HOOK": "0"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "['BITCOS_G128']"


def test_hook_off_fails_like_stock_gguf(bitcos_files, tmp_path):
    """Without the hook, stock gguf-py refuses the file: the tests above pass because of the hook."""
    r = _run([_tool("gguf-dump"), str(bitcos_files["pt"])], tmp_path, env={"GGML_BITCOS_GGUF_HOOK": "0"})
    assert r.returncode != 0 and "is not a valid GGMLQuantizationType" in r.stderr


@pytest.mark.parametrize("name", ["pt", "g128", "z0", "z1", "v1pt", "v1g128"])
def test_gguf_dump(bitcos_files, tmp_path, name):
    f = bitcos_files[name]
    table = _raw_tensor_table(f)
    r = _run([_tool("gguf-dump"), str(f)], tmp_path)
    assert r.returncode == 0, r.stderr
    r2 = _run([_tool("gguf-dump"), "--json", str(f)], tmp_path)
    assert r2.returncode == 0, r2.stderr
    tensors = json.loads(r2.stdout)["tensors"]
    assert set(tensors) == set(table)
    n_bitcos = 0
    for tname, (tt, ne) in table.items():
        info = tensors[tname]
        if tt in BITCOS_TYPE_IDS:
            n_bitcos += 1
            assert info["type"] == _bitcos_type_name(tt)
            assert (tt == 162) == (not name.startswith("v1"))
            assert tname + COMPANION_SUFFIX in tensors
            # the text listing names the type on the tensor's line
            assert any(
                ln.rstrip().endswith(f"| {tname}") and f" {_bitcos_type_name(tt)} " in ln
                for ln in r.stdout.splitlines()
            )
        assert info["shape"] == list(ne)
    assert n_bitcos == 14


@pytest.fixture(scope="module")
def rewritten(bitcos_files, tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """Each BITCOS file through gguf-new-metadata (new description) and gguf-set-metadata (in place)."""
    d = tmp_path_factory.mktemp("rewritten")
    out: dict[str, tuple[Path, Path]] = {}
    for name, f in bitcos_files.items():
        new = d / f"{name}-new.gguf"
        r = _run([_tool("gguf-new-metadata"), str(f), str(new), "--general-description", "rewritten by gguf-py"], d)
        assert r.returncode == 0, r.stderr
        setm = d / f"{name}-set.gguf"
        shutil.copyfile(f, setm)
        ftype = int(open_gguf(f).get_field("general.file_type").contents())
        other = Variant.G128.type_id if ftype != Variant.G128.type_id else Variant.PT.type_id
        r = _run([_tool("gguf-set-metadata"), str(setm), "general.file_type", str(other), "--force"], d)
        assert r.returncode == 0, r.stderr
        out[name] = (new, setm)
    return out


@pytest.mark.parametrize("name", ["pt", "g128", "z0", "z1", "v1pt", "v1g128"])
def test_rewritten_tensors_byte_identical(bitcos_files, rewritten, name):
    src = _tensor_map(bitcos_files[name])
    new, setm = rewritten[name]
    for path in (new, setm):
        got = _tensor_map(path)
        assert list(got) == list(src)
        for tname, (tt, data) in src.items():
            assert got[tname][0] == tt, (path, tname)
            assert got[tname][1] == data, (path, tname)
    r = open_gguf(new)
    assert bytes(r.get_field("general.description").parts[-1]) == b"rewritten by gguf-py"
    r = open_gguf(setm)
    assert int(r.get_field("general.file_type").contents()) in BITCOS_TYPE_IDS
    assert int(r.get_field("general.file_type").contents()) != int(
        open_gguf(bitcos_files[name]).get_field("general.file_type").contents()
    )


@pytest.mark.parametrize("name", ["pt", "g128", "v1g128"])
def test_rewritten_files_run_in_llama(bitcos_files, rewritten, patched_llama, name):
    from ggml_bitcos import llama_run

    base = llama_run.greedy_generate(bitcos_files[name], PROMPT, 16, n_threads=2)
    for path in rewritten[name]:
        g = llama_run.greedy_generate(path, PROMPT, 16, n_threads=2)
        assert g.tokens == base.tokens, path
        assert np.array_equal(g.logits, base.logits), path
