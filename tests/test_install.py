"""One-step install: `pip install .` (checkout or sdist) builds the patched llama.cpp once and ships its llama_cpp
package in the ggml-bitcos wheel (buildsys/ggml_bitcos_backend.py); a stock llama_cpp found at run time makes
every entry point say exactly what to run (ggml_bitcos.llama_tools.not_patched_message).

Fast tests: the sdist holds everything the build reads, the project metadata replaces the llama-cpp-python
dependency by what its llama_cpp imports, and the entry points' message with a stock llama_cpp first on the
path. The slow test (GGML_BITCOS_SLOW=1) installs into clean venvs from the checkout and from a fresh sdist
with the warm cache (~/.cache/ggml-bitcos, ccache) and runs a BITCOS model through `from llama_cpp import
Llama` there: greedy tokens equal to its TQ2_0 source's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from install_helpers import PORTABLE_CMAKE_ARGS, ROOT, build_sdist, stock_llama_cpp, venv_install


@pytest.fixture(scope="module")
def sdist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_sdist(tmp_path_factory.mktemp("sdist"))


def test_sdist_holds_what_the_build_reads(sdist: Path) -> None:
    from ggml_bitcos import build

    with tarfile.open(sdist) as tf:
        names = {n.split("/", 1)[1] for n in tf.getnames() if "/" in n}
    top = sdist.name[: -len(".tar.gz")]
    assert top == "ggml_bitcos-0.1.0"
    # every file the patched llama.cpp build hashes and copies (csrc/ and its folders, patches/, tests/c/)
    read = build.source_files()
    assert any(p.suffix == ".patch" for p in read) and any(p.parent.name == "vulkan" for p in read)
    missing = [str(p.relative_to(ROOT)) for p in read if str(p.relative_to(ROOT)) not in names]
    assert not missing, missing
    for need in (
        "pyproject.toml",
        "CMakeLists.txt",
        "README.md",
        "buildsys/ggml_bitcos_backend.py",
        "startup/ggml_bitcos_gguf.pth",
        "startup/_ggml_bitcos_gguf_hook.py",
        "scripts/install.sh",
        "scripts/build_llama.py",
        "docs/FORMAT.md",
        "docs/ARCHITECTURE.md",
        "ggml_bitcos/build.py",
        "ggml_bitcos/upstream.py",
        "ggml_bitcos/llama_tools.py",
        "gguf_tools/__init__.py",
        "dev/cuda_sass_count.py",
        "tests/conftest.py",
    ):  # the suite runs from an unpacked sdist
        assert need in names, need
    assert not any(n.startswith(("build/", ".git/")) for n in names)


# In a child process with PYTHONPATH=argv[1]: where ggml_bitcos.build finds its sources, and their hash.
SOURCES = """
import json
from ggml_bitcos import build_tree
print(json.dumps({"root": str(build_tree.SOURCE_ROOT), "hash": build_tree.source_hash(),
                  "files": [str(p.relative_to(build_tree.SOURCE_ROOT)) for p in build_tree.source_files()]}))
"""


def _sources_seen_by(python: str, env: dict[str, str], cwd: Path) -> dict:
    r = subprocess.run([python, "-c", SOURCES], capture_output=True, text=True, timeout=120, env=env, cwd=cwd)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def test_installed_layout_finds_the_same_sources(tmp_path: Path) -> None:
    """The package as the wheel installs it (ggml_bitcos/ with _data/ staged by build.stage_sources, as the build
    backend does), away from any checkout: build_tree reads the staged copy and hashes it as the checkout's
    files, so an installed build-llama reuses the cache a checkout's install left."""
    import shutil

    from ggml_bitcos import build

    site = tmp_path / "site-packages"
    for package in ("ggml_bitcos", "gguf_tools"):  # the wheel's packages
        shutil.copytree(ROOT / package, site / package, ignore=shutil.ignore_patterns("__pycache__"))
    copies = build.stage_sources(site / "ggml_bitcos" / "_data")
    assert len(copies) == len(build.source_files())
    env = dict(os.environ, PYTHONPATH=str(site))
    seen = _sources_seen_by(sys.executable, env, tmp_path)
    assert seen["root"] == str(site / "ggml_bitcos" / "_data")
    assert seen["files"] == [str(p.relative_to(ROOT)) for p in build.source_files()]
    assert seen["hash"] == build.source_hash()
    # without the staged copy (a wheel built by another backend), build-llama says what is missing
    shutil.rmtree(site / "ggml_bitcos" / "_data")
    code = "import sys; from ggml_bitcos.cli import main; sys.exit(main(sys.argv[1:]))"
    r = subprocess.run(
        [sys.executable, "-c", code, "build-llama", "--prepare-only", "--work-dir", str(tmp_path / "cache")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert r.returncode == 1 and "no build sources for the patched llama.cpp" in r.stderr, r.stderr[-2000:]


def test_metadata_ships_llama_cpp_instead_of_depending_on_it() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["build-system"]["build-backend"] == "ggml_bitcos_backend"
    assert meta["build-system"]["backend-path"] == ["buildsys"]
    # the wheel holds the product only: no tests, no maintainers' instruments (dev/)
    assert meta["tool"]["scikit-build"]["wheel"]["packages"] == ["ggml_bitcos", "gguf_tools"]
    deps = meta["project"]["dependencies"]
    names = {d.split(">")[0].split("=")[0].split("<")[0].strip().lower().replace("_", "-") for d in deps}
    assert "llama-cpp-python" not in names  # the stock distribution would be compiled first and win
    # what the bundled llama_cpp imports: the pinned llama-cpp-python's own dependencies
    from ggml_bitcos import upstream

    if not upstream.sdist_cached():
        pytest.skip("pinned llama-cpp-python sdist not cached")
    theirs = tomllib.loads(upstream.read_member("pyproject.toml").decode())["project"]["dependencies"]
    for d in theirs:
        name = d.split(">")[0].split("=")[0].strip().lower().replace("_", "-")
        assert name in names, f"{d}: llama_cpp needs it"


def _run_with_stock(folder: Path, code: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(folder), str(ROOT)]))
    return subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=300, cwd=folder
    )


def _assert_says_what_to_run(text: str, pkg: Path) -> None:
    assert f"the llama_cpp at {pkg} is stock llama-cpp-python 0.3.36" in text, text
    assert "cannot load BITCOS files" in text
    # the exact command: this interpreter's pip installing this checkout
    assert f"{sys.executable} -m pip install" in text and str(ROOT) in text, text


@pytest.mark.parametrize(
    "tool", ["llama_cli", "llama_completion", "llama_server", "llama_bench", "llama_perplexity", "rpc_server"]
)
def test_console_scripts_onstock_llama_cpp(tmp_path: Path, tool: str) -> None:
    folder = stock_llama_cpp(tmp_path)
    r = _run_with_stock(folder, f"from ggml_bitcos.llama_tools import {tool}; {tool}()", "--version")
    assert r.returncode == 1
    _assert_says_what_to_run(r.stderr, folder / "llama_cpp")


def test_llama_helpers_onstock_llama_cpp(tmp_path: Path) -> None:
    folder = stock_llama_cpp(tmp_path)
    code = """
import sys
from ggml_bitcos import llama_run
assert not llama_run.is_patched()
for call in (lambda: llama_run.greedy_generate("m.gguf", "Hello"), lambda: llama_run.tool_path("llama-bench"),
             lambda: llama_run.run_bench(["m.gguf"])):
    try:
        call()
    except llama_run.LlamaNotBuilt as e:
        print(e, file=sys.stderr)
    else:
        sys.exit("no error")
"""
    r = _run_with_stock(folder, code)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("is stock llama-cpp-python 0.3.36") == 3  # llama_cpp itself never imported
    _assert_says_what_to_run(r.stderr, folder / "llama_cpp")


def test_bench_onstock_llama_cpp(tmp_path: Path) -> None:
    """`ggml-bitcos bench gemv` (llama-bitcos-bench) ends with the message, no traceback, exit 1."""
    folder = stock_llama_cpp(tmp_path)
    r = _run_with_stock(
        folder,
        "import sys; from ggml_bitcos.cli import main; sys.exit(main(sys.argv[1:]))",
        "bench",
        "gemv",
        "--rows",
        "64",
        "--k",
        "256",
        "--z",
        "0.4",
        "--threads",
        "1",
        "--reps",
        "1",
    )
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    assert r.stderr.startswith("ggml-bitcos: error: ") or "\nggml-bitcos: error: " in r.stderr
    _assert_says_what_to_run(r.stderr, folder / "llama_cpp")


def test_install_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    """From a checkout: `pip install CHECKOUT` with this interpreter; CMAKE_ARGS those the shipped build used
    (llama_build.json), else this environment's."""
    from ggml_bitcos import llama_tools

    monkeypatch.setattr(llama_tools, "_build_info", lambda: {})
    monkeypatch.setenv("CMAKE_ARGS", "-DGGML_VULKAN=ON")
    cmds = llama_tools.install_commands()
    assert cmds[-1].startswith("CMAKE_ARGS=-DGGML_VULKAN=ON " + sys.executable + " -m pip install ")
    assert cmds[-1].endswith(str(ROOT))
    monkeypatch.delenv("CMAKE_ARGS")
    assert llama_tools.install_commands()[-1].startswith(sys.executable)
    monkeypatch.setattr(llama_tools, "_build_info", lambda: {"user_cmake_args": "-DGGML_VULKAN=ON -DGGML_NATIVE=OFF"})
    assert llama_tools.install_commands()[-1].startswith("CMAKE_ARGS='-DGGML_VULKAN=ON -DGGML_NATIVE=OFF' ")


# --------------------------------------------------------------------------------------------- slow: real pip
GREEDY = """
import json, sys
import numpy as np
from llama_cpp import Llama
import llama_cpp
out = {"version": llama_cpp.__version__, "file": llama_cpp.__file__}
for name in sys.argv[1:]:
    llm = Llama(model_path=name, n_ctx=256, n_threads=2, logits_all=True, verbose=False, seed=0)
    toks = llm.tokenize(b"Once upon a time", add_bos=True)
    llm.eval(toks)
    gen = []
    for _ in range(16):
        tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        gen.append(tok)
        llm.eval([tok])
    out[name] = gen
print(json.dumps(out))
"""


def _greedy(venv: Path, *models: Path) -> dict:
    r = subprocess.run(
        [str(venv / "bin" / "python"), "-c", GREEDY, *map(str, models)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=venv,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["version"] == "0.3.36+bitcos1"
    assert res["file"].startswith(str(venv)), res["file"]  # the venv's own llama_cpp, from the wheel
    return res


@pytest.mark.slow
def test_pip_install_checkout_and_sdist(tmp_path: Path) -> None:
    """`pip install .` and `pip install ggml_bitcos-0.1.0.tar.gz` into clean venvs (build isolation, as a user
    runs them; the warm cache keeps the llama.cpp build incremental), then in each venv a BITCOS model made
    and converted by the venv's ggml-bitcos runs through `from llama_cpp import Llama` with the greedy tokens of
    its TQ2_0 source; the venv's llama-completion runs it too, and a stock llama_cpp put in front is named with
    the exact command to run. The wheel carries the llama.cpp build's sources, with the checkout's hash."""
    times = {}
    venv = tmp_path / "venv"
    times["pip install . (checkout)"] = venv_install(venv, str(ROOT), tmp_path / "pip-checkout.log")
    bindir = venv / "bin"
    # the wheel carries the build's sources (ggml_bitcos/_data) and hashes them as this checkout's files
    from ggml_bitcos import build

    seen = _sources_seen_by(str(bindir / "python"), dict(os.environ), tmp_path)
    assert seen["root"].startswith(str(venv)) and seen["root"].endswith("/ggml_bitcos/_data"), seen["root"]
    assert seen["hash"] == build.source_hash()
    src, out = tmp_path / "m-tq2_0.gguf", tmp_path / "m-bitcos.gguf"
    subprocess.run(
        [
            str(bindir / "ggml-bitcos"),
            "make-model",
            "-o",
            str(src),
            "--preset",
            "tiny",
            "--zero-density",
            "0.4",
            "--type",
            "tq2_0",
            "-q",
        ],
        check=True,
        timeout=600,
        cwd=tmp_path,
    )
    subprocess.run(
        [str(bindir / "ggml-bitcos"), "convert", str(src), "-o", str(out)],
        check=True,
        timeout=600,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
    )
    res = _greedy(venv, src, out)
    assert res[str(out)] == res[str(src)] and len(res[str(src)]) == 16

    r = subprocess.run(
        [
            str(bindir / "llama-completion"),
            "-m",
            str(out),
            "-p",
            "Once upon a time",
            "-n",
            "8",
            "--temp",
            "0",
            "-t",
            "2",
            "-no-cnv",
            "--no-warmup",
            "--simple-io",
            "-c",
            "256",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 0, r.stderr[-3000:]

    # a stock llama_cpp in front of the venv's: the console script says what to run in this venv
    stock = stock_llama_cpp(tmp_path / "stock")
    r = subprocess.run(
        [str(bindir / "llama-cli"), "--version"],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=str(stock)),
    )
    assert r.returncode == 1 and "is stock llama-cpp-python 0.3.36" in r.stderr, r.stderr
    assert f"{bindir / 'python'} -m pip install --force-reinstall --no-deps {ROOT}" in r.stderr, r.stderr

    sdist = build_sdist(tmp_path / "dist")
    venv2 = tmp_path / "venv-sdist"
    try:
        times["pip install ggml_bitcos-0.1.0.tar.gz"] = venv_install(venv2, str(sdist), tmp_path / "pip-sdist.log")
        res2 = _greedy(venv2, src, out)
        assert res2[str(out)] == res2[str(src)] == res[str(src)]
    finally:
        # pip caches the wheel it built from the (temporary) sdist: drop it, it would only fill the CI cache
        subprocess.run(
            [str(venv2 / "bin" / "python"), "-m", "pip", "cache", "remove", "ggml_bitcos"],
            capture_output=True,
            timeout=120,
        )
    print("\n" + "\n".join(f"{k}: {v:.0f} s" for k, v in times.items()))


@pytest.mark.slow
def test_pip_install_portable(tmp_path: Path) -> None:
    """`CMAKE_ARGS="-DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON -DGGML_NATIVE=OFF" pip install .` (the build for
    other machines: a CPU backend per x86 ISA level, the best loaded at run time) into a clean venv: the wheel's
    llama_cpp/lib holds the CPU variants and no libggml-cpu.so, and a BITCOS model runs through `Llama` and the
    venv's llama-completion with its TQ2_0 source's greedy tokens. Its own build dir (<cache>/build-portable,
    incremental; tests/test_portable.py checks every variant)."""
    venv = tmp_path / "venv"
    env = dict(os.environ, CMAKE_ARGS=PORTABLE_CMAKE_ARGS)
    seconds = venv_install(venv, str(ROOT), tmp_path / "pip-portable.log", env=env)
    text = (tmp_path / "pip-portable.log").read_text()
    assert "build-portable" in text  # its own build dir, not the native build's
    (lib,) = venv.glob("lib/python3*/site-packages/llama_cpp/lib")
    assert not (lib / "libggml-cpu.so").exists()
    assert len(list(lib.glob("libggml-cpu-*.so"))) >= 14, sorted(p.name for p in lib.iterdir())
    bindir = venv / "bin"
    src, out = tmp_path / "m-tq2_0.gguf", tmp_path / "m-bitcos.gguf"
    make = ["make-model", "-o", str(src), "--preset", "tiny", "--zero-density", "0.4", "--type", "tq2_0", "-q"]
    subprocess.run([str(bindir / "ggml-bitcos"), *make], check=True, timeout=600, cwd=tmp_path)
    subprocess.run(
        [str(bindir / "ggml-bitcos"), "convert", str(src), "-o", str(out)],
        check=True,
        timeout=600,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
    )
    res = _greedy(venv, src, out)
    assert res[str(out)] == res[str(src)] and len(res[str(src)]) == 16
    r = subprocess.run(
        [str(bindir / "llama-completion"), "-m", str(out), "-p", "Once upon a time", "-n", "8", "--temp", "0"]
        + ["-t", "2", "-no-cnv", "--no-warmup", "--simple-io", "-c", "256"],
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "CPU : " in r.stderr, r.stderr[-3000:]  # system_info: the features of the CPU variant it loaded
    print(f"\npip install . (portable): {seconds:.0f} s")
