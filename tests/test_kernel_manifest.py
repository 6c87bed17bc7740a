"""The kernel manifest (csrc/bitcos-kernels.json), the one list of the CPU kernels and their architectures: the C
header written from it is current, it lists every kernel file of csrc/, and docs/CONTRIBUTING.md's list of the
files that adding a kernel touches matches the tree."""

from __future__ import annotations

import re

from dev import kernel_manifest

ROOT = kernel_manifest.ROOT
RECIPE = ROOT / "docs" / "CONTRIBUTING.md"
# the file of csrc/ named like a kernel that is none: the table the kernels are listed in
TABLE = "bitcos-kernels-table.c"


def recipe_files() -> list[str]:
    """The paths of CONTRIBUTING.md's marked list (<!-- cpu-kernel-files --> ... <!-- /cpu-kernel-files -->)."""
    text = RECIPE.read_text()
    m = re.search(r"<!-- cpu-kernel-files -->\n(.*?)<!-- /cpu-kernel-files -->", text, re.S)
    assert m, f"{RECIPE}: no <!-- cpu-kernel-files --> list"
    return re.findall(r"^\* `([^`]+)`", m.group(1), re.M)


def test_header_is_the_manifests() -> None:
    """csrc/bitcos-kernels-list.h is exactly what `python3 -m dev.kernel_manifest` writes from the manifest."""
    want = kernel_manifest.render_header(kernel_manifest.load())
    assert kernel_manifest.HEADER.read_text() == want, "run: python3 -m dev.kernel_manifest"


def test_manifest_lists_every_kernel_file() -> None:
    """Every bitcos-kernels-*.c of csrc/ but the table is a kernel of the manifest, and every manifest source
    exists; each architecture with kernels of its own has what the harness, the fuzzer and mca need."""
    m = kernel_manifest.load()
    files = {p.name for p in kernel_manifest.CSRC.glob("bitcos-kernels-*.c")} - {TABLE}
    assert m.sources() == files
    for a in m.arches.values():
        assert a.machines and a.mca.triple and a.mca.cpus, a.name
        for k in m.kernels_of(a.name):
            assert k.flags and k.build_condition, k.name
    assert m.arch_of_machine("x86_64") == "x86_64" and m.arch_of_machine("arm64") == "aarch64"
    assert m.arch_of_machine("sparc64") is None


def test_header_declares_every_kernel() -> None:
    """The written header declares each kernel's entry point, covers test and build macro, and the table's
    entry list names every kernel in the manifest's order."""
    m = kernel_manifest.load()
    text = kernel_manifest.HEADER.read_text()
    for k in m.kernels:
        assert f"void {k.entry}(" in text, k.name
        assert (f"int {k.covers_fn}(" in text) == k.covers, k.name
        if not k.baseline:
            assert f"#    define {k.build_macro} 1" in text, k.name
    entries = text[text.index("#    define BITCOS_KERNEL_ENTRIES") :]
    found = re.findall(r'\{ "([\w-]+)"|BITCOS_ENTRY_(\w+)', entries)
    assert [a or b.lower().replace("_", "-") for a, b in found if a or b] == [k.name for k in m.baseline_kernels] + [
        k.name for k in m.kernels if not k.baseline
    ]


def test_recipe_lists_the_files_a_kernel_touches() -> None:
    """CONTRIBUTING.md's "Adding a CPU kernel" names the files a new kernel touches: each exists (the kernel
    file as the pattern the manifest's sources match), and it names the manifest, the header written from it
    and the static model, the files that hold kernel-specific lists."""
    files = recipe_files()
    assert files, "empty recipe list"
    for f in files:
        if "<isa>" in f:
            pattern = re.escape(f).replace(re.escape("<isa>"), r"[\w-]+")
            sources = [f"csrc/{s}" for s in kernel_manifest.load().sources()]
            assert all(re.fullmatch(pattern, s) for s in sources), (f, sources)
        else:
            assert (ROOT / f).is_file(), f
    rel = {str(p.relative_to(ROOT)) for p in (kernel_manifest.MANIFEST, kernel_manifest.HEADER)}
    assert rel | {"dev/mca.py"} <= set(files), files
