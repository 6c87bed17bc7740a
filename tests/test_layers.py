"""The code's layering, read from the source with ``ast`` (nothing imported): the GGUF layer (``gguf_tools``)
imports nothing of ``ggml_bitcos``, which builds on it; no test module imports another (shared helpers live in
non-test modules under tests/); no product module is longer than ``MAX_LINES`` (docs/ARCHITECTURE.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 600
# product modules still over MAX_LINES, each with who removes it from here; empty when none is
OVER_LIMIT_ALLOWED: dict[str, str] = {}


def imported_modules(path: Path, text: str | None = None) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in ``path`` (its ``text``, read if not given), at any depth
    (also inside functions); relative imports resolved against the module's package, and each name imported
    from a module also as ``module.name`` (it may be a submodule)."""
    package = list(path.relative_to(ROOT).parts[:-1])
    out: list[tuple[int, str]] = []
    source = path.read_text() if text is None else text
    for node in ast.walk(ast.parse(source, str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                mod = ".".join([*base, *([node.module] if node.module else [])])
            else:
                mod = node.module or ""
            out.append((node.lineno, mod))
            out += [(node.lineno, f"{mod}.{a.name}") for a in node.names]
    return out


def python_files(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def test_gguf_tools_imports_nothing_of_ggml_bitcos() -> None:
    bad = [
        f"{p.relative_to(ROOT)}:{line}: {mod}"
        for p in python_files("gguf_tools")
        for line, mod in imported_modules(p)
        if mod == "ggml_bitcos" or mod.startswith("ggml_bitcos.")
    ]
    assert not bad, "gguf_tools sits below ggml_bitcos and must not import it:\n" + "\n".join(bad)


def test_no_test_module_imports_another() -> None:
    tests = {p.stem for p in (ROOT / "tests").glob("test_*.py")}
    bad = []
    for p in sorted((ROOT / "tests").glob("*.py")):
        for line, mod in imported_modules(p):
            parts = mod.split(".")
            if any(part in tests for part in parts[:2]) and not (parts[0] == "tests" and len(parts) == 1):
                bad.append(f"{p.relative_to(ROOT)}:{line}: {mod}")
    assert not bad, "a test module imports another (move the shared part into a helper module):\n" + "\n".join(bad)


def test_product_modules_within_line_limit() -> None:
    over = {}
    for folder in ("ggml_bitcos", "gguf_tools"):
        for p in python_files(folder):
            n = len(p.read_text().splitlines())
            if n > MAX_LINES:
                over[str(p.relative_to(ROOT))] = n
    unexpected = {k: n for k, n in over.items() if k not in OVER_LIMIT_ALLOWED}
    assert not unexpected, f"product modules over {MAX_LINES} lines (split them): {unexpected}"
    gone = sorted(set(OVER_LIMIT_ALLOWED) - set(over))
    assert not gone, f"within the limit now, take them off OVER_LIMIT_ALLOWED: {gone}"


@pytest.mark.parametrize(
    "source, names",
    [
        ("from gguf_tools import reader\n", {"gguf_tools", "gguf_tools.reader"}),
        ("def f():\n    import ggml_bitcos.codec\n", {"ggml_bitcos.codec"}),
        ("from .. import foreign\n", {"ggml_bitcos", "ggml_bitcos.foreign"}),
        ("from .source import x\n", {"ggml_bitcos.bench.source", "ggml_bitcos.bench.source.x"}),
    ],
)
def test_import_reading(source: str, names: set[str]) -> None:
    """The checks above see imports inside functions and resolve relative ones (as if in ggml_bitcos/bench)."""
    path = ROOT / "ggml_bitcos" / "bench" / "probe.py"
    assert {m for _line, m in imported_modules(path, source)} == names
