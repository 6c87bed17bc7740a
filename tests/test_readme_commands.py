"""Every command the README shows, run as a user runs it: in a clean venv that `./scripts/install.sh` set up from
the checkout, from a folder outside the checkout.

The commands are read from the fenced ```sh blocks of README.md and of docs/INSTALL.md (the install reference the
README sends builds for other CPUs to). HOW says how each one runs; the fast test fails when a document shows a
command HOW does not cover, or HOW keeps one no document shows any more, so the docs and this test move together.
A command runs verbatim unless HOW gives the command line it runs instead and why (a chat tool made single-turn, a
generation bounded, a server's port made free). The placeholders are made first: model-tq2_0.gguf, model.gguf
(TQ2_0), model-f16.gguf, model-bitcos.gguf (converted) and bitnet-i2_s.gguf (bitnet.cpp's I2_S in the ARM
layout); each command runs in a fresh folder with copies of those it names, DIR linked to a folder shared by the
commands that build into it and run from it.

The runs are slow (GGML_BITCOS_SLOW=1): the venv install (~2 min with the warm cache ~/.cache/ggml-bitcos), the
aarch64 cross build (incremental in <cache>/build-aarch64-linux-gnu, as tests/test_aarch64_llama.py builds it) and
the portable build-llama (<cache>/build-portable, as tests/test_install.py's portable install builds it). They run
with this environment's CMAKE_ARGS removed (a user's shell; the commands that set CMAKE_ARGS set it), except the
install itself, which keeps them so that it shares the CMake build directory with the suite's own install (in CI:
-DGGML_VULKAN=ON, which makes it the GPU reference's `CMAKE_ARGS="-DGGML_VULKAN=ON" ./scripts/install.sh`).
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import shutil
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from foreign_gguf import TYPE_ID, quantize_i2_s, read_raw, write_raw
from install_helpers import ROOT, make_venv, venv_env

DOCS = ("README.md", "docs/INSTALL.md")
FENCES = ("```sh", "```bash", "```shell")
PLACEHOLDERS = ("model-tq2_0.gguf", "model.gguf", "model-f16.gguf", "model-bitcos.gguf", "bitnet-i2_s.gguf")
BOUNDED = "-n 8 -st"  # llama-cli: 8 tokens, one turn (its prompt given, it does not wait for the terminal)


@dataclass(frozen=True)
class How:
    """How one documented command is run.

    kind: "run" (in the venv, from a fresh folder; exit 0), "server" (started, reachable on its port, asked once
    where it speaks HTTP, stopped), "apt" (the Debian packages it installs are installed), "ci" (.ci/run runs
    `run` itself: the command runs the suite this test is part of), "covered" (the test `by` runs it).
    run: the command line as run when it is not the documented one ({port}: a free port), with `why`.
    server: the documented server command that must be up while this one runs (its {port}).
    dir: the shared folder that DIR names in the command's folder.
    after: the documented command that must have passed before (it made what this one runs).
    creates: paths the command must leave in its folder.
    needs: "aarch64": the cross toolchain and qemu-user (a failure under BITCOS_REQUIRE_AARCH64=1, else a skip).
    """

    kind: str = "run"
    run: str | None = None
    why: str = ""
    by: str = ""
    server: str | None = None
    dir: str | None = None
    after: str | None = None
    creates: tuple[str, ...] = ()
    needs: str | None = None
    timeout: float = 900


PORTABLE = 'CMAKE_ARGS="-DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON -DGGML_NATIVE=OFF"'
AARCH64_BUILD = "ggml-bitcos build-llama --host aarch64-linux-gnu --target DIR"
RPC_SERVER = "rpc-server -H 0.0.0.0 -p 50052"

HOW: dict[str, How] = {
    # README: the two commands
    "./scripts/install.sh && ggml-bitcos demo": How(
        run="ggml-bitcos demo",
        why="./scripts/install.sh is the venv fixture (run from the checkout with PYTHON=the venv's python)",
        creates=("bitcos-demo",),
    ),
    "./scripts/install.sh && python3 -m pytest -q tests": How(
        kind="ci",
        run="./scripts/install.sh && python3 -m pytest -q -ra tests",
        why="the suite this test belongs to: .ci/run runs it (-ra lists the skips)",
    ),
    # README: everyday use
    "ggml-bitcos convert model-tq2_0.gguf": How(creates=("model-tq2_0-bitcos.gguf",)),
    "ggml-bitcos convert model-f16.gguf --scale row": How(creates=("model-f16-bitcos.gguf",)),
    "ggml-bitcos convert model.gguf --format-version 1": How(creates=("model-bitcos.gguf",)),
    "ggml-bitcos convert --to tq2_0 model-bitcos.gguf": How(),
    "ggml-bitcos convert bitnet-i2_s.gguf --i2s-layout arm": How(creates=("bitnet-i2_s-bitcos.gguf",)),
    "ggml-bitcos info model-bitcos.gguf": How(),
    "ggml-bitcos stats model-bitcos.gguf --tensors": How(),
    "ggml-bitcos stats model.gguf --plot fig1.png": How(creates=("fig1.png",)),
    "ggml-bitcos make-model -o m.gguf --preset bitnet-2b --zero-density 0.42 --type tq2_0": How(creates=("m.gguf",)),
    'llama-cli -m model-bitcos.gguf -p "Hello"': How(
        run=f'llama-cli -m model-bitcos.gguf -p "Hello" {BOUNDED}', why="a chat tool: one bounded turn"
    ),
    "llama-server -m model-bitcos.gguf --port 8080 -np 4": How(
        kind="server", run="llama-server -m model-bitcos.gguf --port {port} -np 4", why="a free port"
    ),
    "llama-bench -m model-tq2_0.gguf -m model-bitcos.gguf": How(),
    'python -c \'from llama_cpp import Llama; print(Llama("model-bitcos.gguf")("Hello", max_tokens=16))\'': How(),
    'llama-cli -m model-bitcos.gguf -ngl 99 -p "Hello"': How(
        run=f'llama-cli -m model-bitcos.gguf -ngl 99 -p "Hello" {BOUNDED}',
        why="a chat tool: one bounded turn (on lavapipe in CI, whose build has Vulkan)",
    ),
    'python -c \'from llama_cpp import Llama; print(Llama("model-bitcos.gguf", n_gpu_layers=-1)("Hello", '
    "max_tokens=16))'": How(),
    RPC_SERVER: How(kind="server", run="rpc-server -H 127.0.0.1 -p {port}", why="loopback, a free port"),
    'llama-cli -m model-bitcos.gguf --rpc 10.0.0.2:50052,10.0.0.3:50052 -ngl 99 -p "Hello"': How(
        run=f'llama-cli -m model-bitcos.gguf --rpc 127.0.0.1:{{port}} -ngl 99 -p "Hello" {BOUNDED}',
        why="one worker on loopback (the rpc-server above), one bounded turn",
        server=RPC_SERVER,
    ),
    "ggml-bitcos bench e2e": How(
        run="ggml-bitcos bench e2e --preset tiny",
        why="the default bitnet-2b shape makes and times three 2.4 B-weight models (~10 min on 2 cores); "
        "make-model above makes that shape as documented",
    ),
    "ggml-bitcos bench kernels": How(),
    # docs/INSTALL.md
    "pip install .": How(kind="covered", by="tests/test_install.py::test_pip_install_checkout_and_sdist"),
    "pip install ggml_bitcos-0.1.0.tar.gz": How(
        kind="covered", by="tests/test_install.py::test_pip_install_checkout_and_sdist"
    ),
    'CMAKE_ARGS="-DGGML_VULKAN=ON" pip install .': How(
        kind="covered",
        by="tests/test_install.py::test_pip_install_checkout_and_sdist",
        why=".ci/run exports CMAKE_ARGS=-DGGML_VULKAN=ON, which that test's installs inherit",
    ),
    "pip install -v .": How(kind="covered", by="tests/test_install.py::test_pip_install_checkout_and_sdist"),
    "apt-get install gcc-aarch64-linux-gnu g++-aarch64-linux-gnu qemu-user": How(kind="apt", needs="aarch64"),
    AARCH64_BUILD: How(dir="aarch64", needs="aarch64", timeout=3600, creates=("DIR/bin/llama-completion",)),
    'qemu-aarch64 -cpu max -L /usr/aarch64-linux-gnu DIR/bin/llama-completion -m model-bitcos.gguf -p "Once upon"': How(
        run='qemu-aarch64 -cpu max -L /usr/aarch64-linux-gnu DIR/bin/llama-completion -m model-bitcos.gguf -p "Once '
        'upon" -n 16',
        why="16 tokens (unbounded, it generates until the context is full: minutes under qemu)",
        dir="aarch64",
        after=AARCH64_BUILD,
        needs="aarch64",
    ),
    f"{PORTABLE} pip install .": How(kind="covered", by="tests/test_install.py::test_pip_install_portable"),
    f"{PORTABLE} ggml-bitcos build-llama --target DIR": How(dir="portable", timeout=3600, creates=("DIR/llama_cpp",)),
}


def _strip_comment(line: str) -> str:
    """The line without its shell comment (a # that starts a word outside quotes)."""
    quote = None
    for i, c in enumerate(line):
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def documented_commands() -> dict[str, list[str]]:
    """Each command of the docs' shell blocks (comments dropped, whitespace collapsed, continuation lines
    joined) -> the documents that show it."""
    found: dict[str, list[str]] = {}
    for doc in DOCS:
        block, pending = False, ""
        for line in (ROOT / doc).read_text().splitlines():
            fence = line.strip()
            if fence.startswith("```"):
                block = not block and fence in FENCES
                continue
            if not block:
                continue
            text = pending + _strip_comment(line).strip()
            if text.endswith("\\"):
                pending = text[:-1] + " "
                continue
            pending = ""
            command = " ".join(text.split())
            if command:
                found.setdefault(command, []).append(doc)
    return found


def test_every_documented_command_has_a_way_to_run() -> None:
    shown = documented_commands()
    assert len(shown) >= 10, shown  # the parser found the blocks
    uncovered = [f"{c}   ({', '.join(docs)})" for c, docs in shown.items() if c not in HOW]
    assert not uncovered, "documented commands this test does not run; add them to HOW:\n" + "\n".join(uncovered)
    stale = [c for c in HOW if c not in shown]
    assert not stale, "HOW runs commands no document shows any more:\n" + "\n".join(stale)


def test_the_table_is_consistent() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    for command, how in HOW.items():
        assert how.kind in ("run", "server", "apt", "ci", "covered"), (command, how.kind)
        assert (how.run is None) == (how.why == "") or how.kind == "covered", f"{command}: a changed run says why"
        if how.kind == "ci":
            assert how.run in ci.splitlines(), f".ci/run does not run {how.run!r}"
        if how.kind == "covered":
            path, _, name = how.by.partition("::")
            assert f"\ndef {name}(" in (ROOT / path).read_text(), how.by
        for ref in (how.server, how.after):
            assert ref is None or ref in HOW, ref
        if how.server is not None:
            assert HOW[how.server].kind == "server" and "{port}" in (how.run or ""), command
        uses_dir = re.search(r"\bDIR\b", how.run or command) is not None
        assert uses_dir == (how.dir is not None), f"{command}: DIR and dir go together"
    # the whole suite runs with the commands' own slow run after it
    assert "tests/test_readme_commands.py" in ci


# --------------------------------------------------------------------------------------------- slow: real runs
RUNS = [c for c, how in HOW.items() if how.kind in ("run", "server", "apt")]
outcomes: dict[str, str] = {}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _aarch64_missing() -> list[str]:
    from ggml_bitcos import build

    host = build.CROSS_HOSTS["aarch64-linux-gnu"]
    return build.cross_tools_missing(host) + [e for e in host.emulator()[:1] if shutil.which(e) is None]


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clean venv set up by `./scripts/install.sh` from the checkout (PYTHON=its python), as the README's
    first command does for the user's python."""
    folder = tmp_path_factory.mktemp("readme")
    venv = folder / "venv"
    make_venv(venv)
    env = venv_env(venv)
    env["PYTHON"] = str(venv / "bin" / "python")
    log = folder / "install.log"
    t0 = time.monotonic()
    with open(log, "w") as f:
        r = subprocess.run(
            ["./scripts/install.sh"], cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=7200
        )
    assert r.returncode == 0, log.read_text()[-4000:]
    print(f"\n./scripts/install.sh into a clean venv: {time.monotonic() - t0:.0f} s")
    return venv


@pytest.fixture(scope="module")
def user_env(venv: Path) -> dict[str, str]:
    env = venv_env(venv)
    env.pop("CMAKE_ARGS", None)
    return env


def _run(command: str, cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", command],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def _i2_s_arm(src: Path, dst: Path) -> Path:
    """src (a TQ2_0 model) with every TQ2_0 tensor as bitnet.cpp's I2_S in its ARM layout, same values."""
    from ggml_bitcos import tq

    n_kv, kv, tensors = read_raw(src)
    out = []
    for name, ne, tt, raw in tensors:
        if tt == TYPE_ID["TQ2_0"]:
            k, rows = ne[0], math.prod(ne[1:])
            codes, d = tq.tq2_0_decode(np.frombuffer(raw, np.uint8)[: rows * k // 256 * 66].reshape(rows, -1))
            assert np.all(d == d[0, 0])  # make-model's default: one scale per matrix, as I2_S stores
            out.append((name, ne, TYPE_ID["I2_S"], quantize_i2_s(codes.astype(np.float32) * d[0, 0], "arm")))
        else:
            out.append((name, ne, tt, raw))
    return write_raw(dst, n_kv, kv, out)


@pytest.fixture(scope="module")
def placeholders(venv: Path, user_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The files the commands name, made with the venv's ggml-bitcos (tiny models, zero density 0.4)."""
    folder = tmp_path_factory.mktemp("placeholders")
    make = "ggml-bitcos make-model --preset tiny --zero-density 0.4 -q"
    for step in (
        f"{make} --type tq2_0 -o model-tq2_0.gguf",
        f"{make} --type f16 -o model-f16.gguf",
        "cp model-tq2_0.gguf model.gguf",
        "ggml-bitcos convert model-tq2_0.gguf -o model-bitcos.gguf",
    ):
        r = _run(step, folder, user_env, 600)
        assert r.returncode == 0, f"{step}:\n{r.stdout[-2000:]}{r.stderr[-2000:]}"
    _i2_s_arm(folder / "model-tq2_0.gguf", folder / "bitnet-i2_s.gguf")
    assert sorted(p.name for p in folder.iterdir()) == sorted(PLACEHOLDERS)
    return folder


def _folder(base: Path, placeholders: Path, command: str, how: How) -> Path:
    """A fresh folder for the command with copies of the placeholders it names (only those: a file it writes by
    default may be another one's name, e.g. convert --to tq2_0 model-bitcos.gguf writes model-tq2_0.gguf) and DIR
    linked to its shared folder."""
    cwd = base / f"cmd-{list(HOW).index(command)}"
    cwd.mkdir()
    named = set(re.findall(r"[\w.-]+\.gguf", how.run or command))
    for p in placeholders.iterdir():
        if p.name in named:
            shutil.copy2(p, cwd / p.name)
    if how.dir is not None:
        shared = base / "shared" / how.dir
        shared.mkdir(parents=True, exist_ok=True)
        (cwd / "DIR").symlink_to(shared, target_is_directory=True)
    return cwd


class _Server:
    """A documented server command, started in the background on a free port and stopped on exit."""

    def __init__(self, command: str, cwd: Path, env: dict[str, str]) -> None:
        self.port = _free_port()
        run = (HOW[command].run or command).format(port=self.port)
        self.log = open(cwd / "server.log", "w")
        self.proc = subprocess.Popen(
            ["bash", "-c", f"exec {run}"], cwd=cwd, env=env, stdout=self.log, stderr=subprocess.STDOUT
        )

    def wait_listening(self, timeout: float = 120) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise AssertionError(f"exited {self.proc.returncode}:\n{Path(self.log.name).read_text()[-3000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.5)
        raise AssertionError(f"not listening on {self.port} after {timeout} s")

    def __enter__(self) -> _Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def _http_completion(port: int, timeout: float = 180) -> dict:
    """POST /completion once llama-server's /health says the model is loaded."""
    end = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    break
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.5)
    body = json.dumps({"prompt": "Hello", "n_predict": 8}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def _needs(how: How) -> None:
    if how.needs == "aarch64":
        missing = _aarch64_missing()
        if missing:
            if os.environ.get("BITCOS_REQUIRE_AARCH64") == "1":
                pytest.fail(f"BITCOS_REQUIRE_AARCH64=1 but {', '.join(missing)} missing")
            pytest.skip(f"no aarch64 cross toolchain / qemu-user: {', '.join(missing)} missing")


def _test_id(command: str) -> str:
    """The command's first three words after its variable assignments, e.g. ggml-bitcos-build-llama---host."""
    words = [w for w in shlex.split(command) if not re.match(r"^\w+=", w)]
    return "-".join(re.sub(r"[^\w.-]", "", w) for w in words[:3])[:48]


def _apt_packages(command: str) -> list[str]:
    words = command.split()
    return [w for w in words[words.index("install") + 1 :] if not w.startswith("-")]


@pytest.mark.slow
@pytest.mark.parametrize("command", RUNS, ids=[_test_id(c) for c in RUNS])
def test_documented_command_runs(
    command: str,
    venv: Path,
    user_env: dict[str, str],
    placeholders: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    how = HOW[command]
    _needs(how)
    outcomes[command] = "failed"
    if how.kind == "apt":
        if shutil.which("dpkg-query") is None:
            pytest.skip("not a Debian system")
        for pkg in _apt_packages(command):
            r = subprocess.run(["dpkg-query", "-W", "-f=${Status}", pkg], capture_output=True, text=True)
            assert "install ok installed" in r.stdout, f"{pkg} is not installed"
        outcomes[command] = "passed"
        return
    if how.after is not None and outcomes.get(how.after) != "passed":
        if outcomes.get(how.after) == "failed":
            pytest.fail(f"needs {how.after!r}, which failed")
        pytest.skip(f"needs {how.after!r}, which did not run")
    base = tmp_path_factory.getbasetemp() / "readme-runs"
    base.mkdir(exist_ok=True)
    cwd = _folder(base, placeholders, command, how)
    if how.kind == "server":
        with _Server(command, cwd, user_env) as server:
            server.wait_listening()
            if command.startswith("llama-server"):
                assert "content" in _http_completion(server.port)
        outcomes[command] = "passed"
        return
    t0 = time.monotonic()
    if how.server is not None:
        with _Server(how.server, cwd, user_env) as server:
            server.wait_listening()
            r = _run((how.run or command).format(port=server.port), cwd, user_env, how.timeout)
    else:
        r = _run(how.run or command, cwd, user_env, how.timeout)
    assert r.returncode == 0, f"{how.run or command} (in {cwd}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    for path in how.creates:
        assert (cwd / path).exists(), f"{command} left no {path} in {cwd}"
    if "build-llama" in command:
        # the wheel's sources hash as the checkout's: the tree the suite's install staged is reused as it is
        assert "applied" not in r.stdout, r.stdout[-3000:]
    print(f"\n{command}: {time.monotonic() - t0:.0f} s")
    outcomes[command] = "passed"
