"""Running models through the patched llama.cpp: Python bindings and the installed tools.

Used by `ggml-bitcos demo`, the benchmarks and the end-to-end tests, so all of them exercise the same
real code paths (llama_cpp.Llama, llama-bench, llama-server). Helpers only the tests need (llama-completion,
llama-cli, llama-perplexity runs) are in tests/llama_helpers.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ggml_bitcos import llama_tools

PATCHED_VERSION_SUFFIX = llama_tools.PATCHED_VERSION_SUFFIX


LlamaNotBuilt = llama_tools.ToolNotBuiltError

# True when the installed llama_cpp is the BITCOS build (its version carries the +bitcos tag); when it is not,
# llama_tools.not_patched_message() says what to run, and greedy_generate / tool_path raise LlamaNotBuilt with it
is_patched = llama_tools.is_patched


tool_path = llama_tools.tool_path

# what llama.cpp logs when it refuses a model or cannot create a context (the patched build records the
# same reason for the Python bindings: Llama() raises it)
_LOAD_ERROR_RE = re.compile(
    r"(?:error loading model|failed to initialize the context|failed to load model "
    r"'[^']*'): (.+)"
)


def load_error(log: str) -> str | None:
    """The reason llama.cpp gave for refusing a model, from a tool's log, or None."""
    found = _LOAD_ERROR_RE.findall(log)
    return found[-1].strip() if found else None


def tool_failure(tool: str, returncode: int, model: Path | str, log: str) -> RuntimeError:
    """The exception for a failed llama.cpp tool run: the refusal reason first when there is one (a crafted
    or corrupted BITCOS file names its tensor), then the log's tail."""
    reason = load_error(log)
    head = f"{tool} failed ({returncode}) on {model}" + (f": {reason}" if reason else "")
    return RuntimeError(f"{head}\n{log[-3000:]}")


@dataclass
class Generation:
    tokens: list[int]
    logits: np.ndarray  # [n_generated, n_vocab] float32, logits that chose each token
    text: str
    prompt_tokens: int
    seconds: float  # wall time of the generation loop (excludes load)
    load_seconds: float = 0.0
    meta: dict = field(default_factory=dict)

    @property
    def tokens_per_second(self) -> float:
        return len(self.tokens) / self.seconds if self.seconds > 0 else float("nan")


def greedy_generate(
    model: Path,
    prompt: str,
    n_tokens: int = 64,
    n_threads: int | None = None,
    n_ctx: int = 512,
    use_mmap: bool = True,
    n_gpu_layers: int = 0,
    verbose: bool = False,
) -> Generation:
    """Greedy decoding through llama_cpp.Llama, returning the tokens and the logits of every step.

    n_gpu_layers as in llama.cpp (-1: all); which GPU devices exist is the backend's business (e.g.
    GGML_VK_VISIBLE_DEVICES for Vulkan), so callers that want a device pick it in the environment. verbose:
    llama.cpp's load log on stderr (device buffers, offloaded layers). Raises LlamaNotBuilt, saying what to
    run, when the llama_cpp found is not the BITCOS build."""
    llama_tools.require_patched()
    from llama_cpp import Llama  # imported here: loading the library is the caller's choice

    t0 = time.perf_counter()
    llm = Llama(
        model_path=str(model),
        n_ctx=n_ctx,
        n_threads=n_threads or os.cpu_count(),
        n_threads_batch=n_threads or os.cpu_count(),
        logits_all=True,
        verbose=verbose,
        seed=0,
        use_mmap=use_mmap,
        n_gpu_layers=n_gpu_layers,
    )
    load_s = time.perf_counter() - t0
    prompt_toks = llm.tokenize(prompt.encode(), add_bos=True)
    t1 = time.perf_counter()
    llm.eval(prompt_toks)
    out: list[int] = []
    logits: list[np.ndarray] = []
    for _ in range(n_tokens):
        row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        tok = int(np.argmax(row))
        logits.append(row)
        out.append(tok)
        llm.eval([tok])
    secs = time.perf_counter() - t1
    text = llm.detokenize(out).decode("utf-8", errors="replace")
    del llm
    return Generation(out, np.stack(logits), text, len(prompt_toks), secs, load_s)


def run_bench(
    models: list[Path],
    n_prompt: int = 512,
    n_gen: int = 128,
    threads: list[int] | None = None,
    repetitions: int = 3,
    timeout: float = 3600,
    extra: list[str] | None = None,
    env: dict[str, str] | None = None,
) -> list[dict]:
    """llama-bench in JSON mode over several models in one run; `extra`: more llama-bench options
    (e.g. ["-ngl", "99"]); `env`: variables added to its environment (e.g. GGML_BITCOS_CPU_FORM)."""
    cmd = [str(tool_path("llama-bench"))]
    for m in models:
        cmd += ["-m", str(m)]
    cmd += ["-p", str(n_prompt), "-n", str(n_gen), "-r", str(repetitions), "-o", "json", *(extra or [])]
    if threads:
        cmd += ["-t", ",".join(str(t) for t in threads)]
    r = subprocess.run(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **env} if env else None,
    )
    if r.returncode != 0:
        raise tool_failure("llama-bench", r.returncode, ", ".join(map(str, models)), r.stderr)
    return json.loads(r.stdout)


class LlamaServer:
    """llama-server on a free loopback port, stopped on exit (bounded waits, never left running)."""

    def __init__(self, model: Path, threads: int = 2, ctx: int = 512, extra: list[str] | None = None):
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.cmd = [
            str(tool_path("llama-server")),
            "-m",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "-t",
            str(threads),
            "-c",
            str(ctx),
            "--no-webui",
            *(extra or []),
        ]
        self.proc: subprocess.Popen | None = None
        self._log = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        """The server's log so far (stderr goes to a temporary file: a pipe nobody reads while requests run
        would fill up and stall the server)."""
        if self._log is None:
            return ""
        self._log.flush()
        self._log.seek(0)
        return self._log.read().decode("utf-8", errors="replace")

    def __enter__(self) -> "LlamaServer":
        import tempfile

        import requests

        self._log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=self._log, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise tool_failure("llama-server", self.proc.returncode, self.cmd[2], self.log())
            try:
                if requests.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.3)
        self.__exit__(None, None, None)
        raise RuntimeError("llama-server did not become healthy within 120 s")

    def __exit__(self, *exc) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=20)
        if self._log is not None:
            self._log.close()
            self._log = None

    def chat(self, content: str, max_tokens: int = 16) -> dict:
        import requests

        r = requests.post(
            self.url + "/v1/chat/completions",
            timeout=120,
            json={
                "messages": [{"role": "user", "content": content}],
                "max_tokens": max_tokens,
                "temperature": 0,
                "seed": 0,
            },
        )
        r.raise_for_status()
        return r.json()

    def complete(self, prompt: str, n_predict: int = 16, seed: int = 0, timeout: float = 300) -> dict:
        """One greedy raw completion (/completion: no chat template), the JSON reply."""
        import requests

        r = requests.post(
            self.url + "/completion",
            timeout=timeout,
            json={
                "prompt": prompt,
                "n_predict": n_predict,
                "temperature": 0,
                "top_k": 1,
                "seed": seed,
                "cache_prompt": False,
            },
        )
        r.raise_for_status()
        return r.json()
