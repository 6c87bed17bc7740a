"""Distributed inference: a BITCOS model split across two llama.cpp RPC servers on localhost (`--rpc`, how
llama.cpp spreads a model over machines) generates the same greedy tokens as the same model run locally.

The weights and their companions reach the servers as ordinary tensors (ggml-rpc serializes every source of a
node, so the companion link survives) and run there on the patched CPU backend; the client validated them on
the host at load, before upload.
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from ggml_bitcos import llama_run
from ggml_bitcos.llama_tools import RPC_SERVER
import llama_helpers


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def rpc_servers(n: int, log_dir: Path) -> Iterator[list[str]]:
    """n rpc-servers on loopback (one thread each), their stdout in log_dir/rpc-<i>.log; yields their
    host:port endpoints; always stopped."""
    exe = llama_run.tool_path(RPC_SERVER)
    procs, endpoints = [], []
    try:
        for i in range(n):
            port = free_port()
            with open(log_dir / f"rpc-{i}.log", "w") as log:
                procs.append(
                    subprocess.Popen(
                        [str(exe), "-H", "127.0.0.1", "-p", str(port), "-t", "1"],
                        stdout=log,
                        stderr=subprocess.PIPE,
                        text=True,
                        stdin=subprocess.DEVNULL,
                    )
                )
            endpoints.append(f"127.0.0.1:{port}")
        for p, ep in zip(procs, endpoints):
            host, port = ep.split(":")
            deadline = time.monotonic() + 60
            while True:
                if p.poll() is not None:
                    raise RuntimeError(f"rpc-server exited ({p.returncode}): {p.stderr.read()[-2000:]}")
                try:
                    with socket.create_connection((host, int(port)), timeout=1):
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"rpc-server {ep} did not listen within 60 s")
                    time.sleep(0.2)
        yield endpoints
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=20)


@pytest.mark.llama
@pytest.mark.parametrize("scale", ["tensor", "g128"])
def test_bitcos_model_split_over_two_rpc_servers(patched_llama, model_factory, tmp_path: Path, scale: str):
    """Both variants (PT from per-tensor scales, G128 from per-block ones): 24 greedy tokens through two
    rpc-servers (all layers offloaded, -ngl 99, split over both) equal the local run's, and the BITCOS model
    equals its TQ2_0 source over RPC too."""
    from ggml_bitcos import convert

    src = model_factory(z=0.42, scale=scale, seed=3)
    out = tmp_path / f"rpc-{scale}-bitcos.gguf"
    convert.convert(src, out, progress=False)
    prompt = "Once upon a time"
    local = llama_helpers.run_completion(out, prompt, n_tokens=24, threads=1)
    with rpc_servers(2, tmp_path) as eps:
        extra = ["--rpc", ",".join(eps), "-ngl", "99"]
        remote = llama_helpers.run_completion(out, prompt, n_tokens=24, threads=1, extra=extra)
        remote_src = llama_helpers.run_completion(src, prompt, n_tokens=24, threads=1, extra=extra)
    assert remote == local and remote_src == remote
    assert len(remote) > len(prompt)
    for i in range(2):  # the layers really went to both servers (llama.cpp splits them over the devices)
        assert "Accepted client connection" in (tmp_path / f"rpc-{i}.log").read_text()
