"""The docs name only things that exist: every repository path in a code span of README.md and docs/*.md is a
file or folder of this tree, every code symbol they name in a code span occurs in the tree's source, and every
relative link points at an existing file (and heading, for `#anchor` links).

What counts, to keep false positives out (docs/notes/ is dated history and not checked):
- a path: a span without spaces whose first component is a top-level folder or file of this repository
  (`csrc/...`, `tests/...`, `dev/...`, ...); globs must match something; a bare source file name
  (`ggml-bitcos-link.c`) must exist somewhere in the tree;
- a symbol: a span that is an identifier, possibly qualified (`info.validate_bitcos_tensor`,
  `bitcos_sycl::read_layout`) and possibly called (`gamma_l1()`); each part that contains `_`, and the called
  name, must occur as a word in the source folders below. Not checked: spans with spaces (command lines),
  options (`--x`), all-caps names (environment variables, upstream macros), names shorter than 4 characters
  (math such as `n_j`), names under `ggml/` or `vendor/` paths, and the upstream llama.cpp / toolchain names
  in UPSTREAM.

Each document is one test that lists all of its misses at once.

The docs also stay short enough to read (README.md <= 250 lines, PERFORMANCE.md and KERNELS.md <= 350: reference
goes to docs/, history to git and docs/notes/), and numbered sections run in order in every document
(`## 2.`, `### 2b.`, `### 2.1`, ... each after the one before).
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SOURCE_DIRS = ("csrc", "ggml_bitcos", "gguf_tools", "tests", "dev", "scripts", "patches", "buildsys", "startup")
SOURCE_FILES = ("CMakeLists.txt", "pyproject.toml")
SOURCE_SUFFIXES = {
    ".c",
    ".h",
    ".cpp",
    ".hpp",
    ".cu",
    ".cuh",
    ".py",
    ".sh",
    ".comp",
    ".patch",
    ".txt",
    ".toml",
    ".pth",
    ".supp",
    ".glsl",
    ".cmake",
    "",
}
# a bare file name is checked when it has one of these suffixes
FILE_SUFFIXES = (".c", ".h", ".cpp", ".hpp", ".cu", ".cuh", ".py", ".sh", ".comp", ".patch")

# Names the docs cite from upstream llama.cpp / ggml / gguf-py, the C library, intrinsics and toolchains: they
# are the anchors the project builds on, not code of this tree.
UPSTREAM = {
    # ggml / llama.cpp
    "ggml_vec_dot_tq2_0_q8_K",
    "ggml_row_size",
    "ggml_type_traits_cpu",
    "ggml_get_type_traits_cpu",
    "ggml_cpu_init",
    "ggml_cuda_pool_alloc",
    "gguf_init_from_file_impl",
    "llama_model_load",
    "mul_mat_vec_tq2_0",
    "mul_mat_vec_tq2_0.comp",
    "mul_mm.comp",
    "test_backend_ops",
    "ggml_backend_sched",
    "llama_context",
    "block_tq2_0",
    "block_q8_K",
    "ggml_vec_dot_t",
    "ggml_type",
    "ggml_tensor",
    "cudaGraphExecUpdate",
    "cublasGemmEx",
    "dequantize_row_tq2_0",
    "dequantize_row_tq1_0",
    "dequantize_row_q2_0",
    "block_q2_0",
    "ggml.h",
    "ggml.c",
    "ggml-quants.c",
    "ggml-common.h",
    "gguf.cpp",
    "ggml-cpu.c",
    "ops.cpp",
    "quants.c",
    "arch-fallback.h",
    "ggml-vulkan.cpp",
    "ggml-cuda.cu",
    "ggml-sycl.cpp",
    "llama-quant.cpp",
    # the other llama.cpp lines whose formats the converter reads (bitnet.cpp, Prism ML's fork)
    "quantize_i2_s",
    "quantize_to_i2_s",
    "dequantize_row_i2_s",
    "quantize_row_pq2_0_ref",
    "dequantize_row_pq2_0",
    "dequantize_row_ptq1_0",
    "block_ptq1_0",
    "ptq1_0_stages",
    "gemm-config.h",
    # gguf-py
    "GGML_QUANT_SIZES",
    "raw_shape",
    "GGUFReader",
    "GGUFWriter",
    # x86 intrinsics and instructions
    "_mm256_add_ps",
    "_mm256_mul_ps",
    "vfmaq_f32",
    "vmulq_f32",
    "vaddq_f32",
    "_cvtsh_ss",
    "cvtsh_ss",
    "_mm512_dpbusd_epi32",
    "_pdep_u64",
    "_mm512_mask_mov_epi8",
    # CUDA / SYCL
    "__syncthreads",
    "__syncwarp",
    "__shfl_up_sync",
    "__dp4a",
    "joint_matrix",
    "joint_matrix_mad",
    "shfl_sync",
    "ext_intel_matrix",
    # Python / CPython
    "sys.meta_path",
    "meta_path",
    "distutils_precedence",
    "site_packages",
    "find_spec",
}

# Names a worked example may use before they exist (none: CONTRIBUTING.md's example is the NEON kernel, which exists).
# Spans with `<placeholders>` are templates and not checked either.
EXAMPLE_NAMES: set[str] = set()

SPAN_RE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
LINK_RE = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
SYMBOL_RE = re.compile(rf"^(~?{IDENT}(?:(?:\.|::){IDENT})*)(\(.*\))?$")


@lru_cache(maxsize=1)
def top_level() -> frozenset[str]:
    return frozenset(p.name for p in ROOT.iterdir() if not p.name.startswith("."))


@lru_cache(maxsize=1)
def source_words() -> frozenset[str]:
    """Every identifier-like word of the source folders (this test excluded: its allowlist names words)."""
    words: set[str] = set()
    paths = [ROOT / f for f in SOURCE_FILES]
    for d in SOURCE_DIRS:
        paths += [p for p in (ROOT / d).rglob("*") if p.is_file() and p.suffix in SOURCE_SUFFIXES]
    for p in paths:
        if p.resolve() == Path(__file__).resolve() or "__pycache__" in p.parts:
            continue
        try:
            text = p.read_text(errors="ignore")
        except OSError:
            continue
        words.update(re.findall(IDENT, text))
    return frozenset(words)


@lru_cache(maxsize=1)
def file_names() -> frozenset[str]:
    names = set()
    for d in SOURCE_DIRS + ("docs",):
        names.update(p.name for p in (ROOT / d).rglob("*") if p.is_file())
    return frozenset(names)


def code_spans(text: str):
    """(line number, span) of every inline code span outside fenced blocks."""
    fenced = False
    for no, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        for m in SPAN_RE.finditer(line):
            yield no, m.group(1).strip()


def check_path(span: str) -> str | None:
    """None if span is no repository path or exists; else why it is a miss."""
    path = span.rstrip("/.,;:")
    path = re.sub(r":\d+(-\d+)?$", "", path)  # file:line
    first = path.split("/", 1)[0]
    if "/" not in path and first not in top_level():
        if path.endswith(FILE_SUFFIXES) and re.fullmatch(r"[\w.+-]+", path) and path not in UPSTREAM:
            return None if path in file_names() else "no file of this name in the tree"
        return None
    if first not in top_level() or first in ("ggml", "vendor"):
        return None
    if any(c in path for c in "*?["):
        return None if list(ROOT.glob(path)) else "glob matches nothing"
    return None if (ROOT / path).exists() else "no such path"


def check_symbol(span: str) -> str | None:
    m = SYMBOL_RE.match(span)
    if not m or span in UPSTREAM:
        return None
    name, call = m.group(1).lstrip("~"), m.group(2)
    parts = re.split(r"\.|::", name)
    if "." in name and parts[-1] in {
        "py",
        "c",
        "h",
        "cpp",
        "hpp",
        "cu",
        "cuh",
        "comp",
        "md",
        "sh",
        "so",
        "gguf",
        "json",
        "png",
        "spv",
        "toml",
        "pth",
        "txt",
        "patch",
        "log",
    }:
        return None  # a file name, check_path's business
    missing = []
    for i, part in enumerate(parts):
        checked = "_" in part.strip("_") or (call is not None and i == len(parts) - 1)
        if not checked or len(part) < 4 or part.isupper() or part in UPSTREAM or ".".join(parts[i:]) in UPSTREAM:
            continue
        if part not in source_words():
            missing.append(part)
    return f"not in the source: {', '.join(missing)}" if missing else None


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return s.replace(" ", "-")


def check_link(doc: Path, target: str) -> str | None:
    if re.match(r"^[a-z]+:", target) or target.startswith("mailto:"):
        return None
    path, _, anchor = target.partition("#")
    dest = (doc.parent / path).resolve() if path else doc
    if not dest.exists():
        return "link target does not exist"
    if anchor and dest.suffix == ".md":
        headings = {slug(h) for h in re.findall(r"^#+\s+(.*)$", dest.read_text(), re.M)}
        if anchor not in headings:
            return f"no heading for #{anchor} in {dest.name}"
    return None


def misses(doc: Path) -> list[str]:
    text = doc.read_text()
    rel = doc.relative_to(ROOT)
    out = []
    for no, span in code_spans(text):
        if " " in span or span.startswith("-") or not span or "<" in span or span in EXAMPLE_NAMES:
            continue
        why = check_path(span) if ("/" in span or "." in span) else None
        if why is None and "/" not in span:
            why = check_symbol(span)
        if why:
            out.append(f"{rel}:{no}: `{span}`: {why}")
    for no, line in enumerate(text.splitlines(), 1):
        for m in LINK_RE.finditer(line):
            why = check_link(doc, m.group(1))
            if why:
                out.append(f"{rel}:{no}: ({m.group(1)}): {why}")
    return out


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_doc_names_only_what_exists(doc: Path) -> None:
    found = misses(doc)
    assert not found, f"{len(found)} name(s) in {doc.relative_to(ROOT)} that the tree does not have:\n" + "\n".join(
        found
    )


# The longest each document may grow; past it, reference material moves into docs/ and history into docs/notes/.
MAX_LINES = {"README.md": 250, "docs/PERFORMANCE.md": 350, "docs/KERNELS.md": 350}

# "3.", "3b.", "3.1", "3.1.2" at the start of a heading's text
SECTION_NUMBER_RE = re.compile(r"^(\d+)([a-z])?((?:\.\d+)*)\.?(?=\s|$)")


def section_key(heading: str) -> tuple[int, ...] | None:
    """Sort key of a numbered heading: "5" (5, 0), "5.1" (5, 0, 1), "5b" (5, 2), "5b.1" (5, 2, 1); None if unnumbered.

    A letter is a sibling after the plain number and its dotted subsections (5, 5.1, 5.2, 5b, 5c)."""
    m = SECTION_NUMBER_RE.match(heading.strip())
    if not m:
        return None
    letter = ord(m.group(2)) - ord("a") + 1 if m.group(2) else 0
    return (int(m.group(1)), letter, *(int(x) for x in m.group(3).split(".") if x))


def headings(text: str) -> list[tuple[int, str]]:
    """(line number, text) of every Markdown heading outside fenced blocks."""
    out, fenced = [], False
    for no, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"^#{1,6}\s+(.*)$", line)):
            out.append((no, m.group(1)))
    return out


def section_order_misses(text: str) -> list[str]:
    """Each numbered heading whose number is not after the previous numbered heading's."""
    out, last = [], None
    for no, heading in headings(text):
        key = section_key(heading)
        if key is None:
            continue
        if last is not None and key <= last[0]:
            out.append(f"line {no}: '{heading}' comes after '{last[1]}'")
        last = (key, heading)
    return out


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_numbered_sections_in_order(doc: Path) -> None:
    found = section_order_misses(doc.read_text())
    assert not found, f"{doc.relative_to(ROOT)}: sections out of order:\n" + "\n".join(found)


@pytest.mark.parametrize("name", sorted(MAX_LINES))
def test_doc_length(name: str) -> None:
    lines = len((ROOT / name).read_text().splitlines())
    assert lines <= MAX_LINES[name], (
        f"{name} has {lines} lines, more than {MAX_LINES[name]}: move reference material into docs/ "
        "and history into docs/notes/"
    )


def test_section_order_check_catches_misorder() -> None:
    """The order check knows letters and dotted subsections, and fails on KERNELS.md's old 1, 1b, 2, 2b, 3, 2c."""
    assert section_key("5. GPU") == (5, 0)
    assert section_key("5.1 The fast mat-vec") == (5, 0, 1)
    assert section_key("2d. The aarch64 kernels") == (2, 4)
    assert section_key("How to read the numbers") is None
    assert section_key("2026-12-02 history") is None
    ordered = "# T\n## 1. a\n### 1b. b\n## 2. c\n### 2.1 d\n### 2.2 e\n### 2b. f\n## 3. g\n## Tests\n"
    assert section_order_misses(ordered) == []
    misordered = "## 1. a\n### 1b. b\n## 2. c\n## 3. d\n### 2c. e\n```sh\n# 9. a comment\n```\n"
    assert section_order_misses(misordered) == ["line 5: '2c. e' comes after '3. d'"]
    assert section_order_misses("## 1. a\n## 1. b\n") == ["line 2: '1. b' comes after '1. a'"]


def test_the_checks_catch_misses() -> None:
    """The checks fail on a made-up path, symbol and anchor, and pass on real ones."""
    assert check_path("csrc/no-such-file.c") == "no such path"
    assert check_path("csrc/bitcos-format.h") is None
    assert check_path("ggml/src/ggml.c") is None  # upstream tree: not checked
    assert check_symbol("no_such_function_anywhere()").startswith("not in the source")
    assert check_symbol("info.validate_bitcos_tensor") is None
    assert check_symbol("GGML_BITCOS_ANYTHING") is None  # all caps: not checked
    assert check_link(ROOT / "README.md", "docs/PERFORMANCE.md#no-such-heading").startswith("no heading")
    assert check_link(ROOT / "README.md", "docs/PERFORMANCE.md") is None
