"""The BITCOS CPU kernel manifest (csrc/bitcos-kernels.json), read for Python, and the C header written from it.

The manifest is the one list of the CPU kernels and the architectures they are built for; the root
CMakeLists.txt reads the JSON itself, the C sources read `csrc/bitcos-kernels-list.h`, which this module writes
(committed, because the ggml-cpu build inside llama.cpp compiles csrc/ as it is; tests/test_kernel_manifest.py
fails when it is not what the manifest gives):

    python3 -m dev.kernel_manifest            # rewrite csrc/bitcos-kernels-list.h from the manifest
    python3 -m dev.kernel_manifest --check    # exit 1 when it differs
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

ROOT: Final = Path(__file__).resolve().parent.parent
CSRC: Final = ROOT / "csrc"
MANIFEST: Final = CSRC / "bitcos-kernels.json"
HEADER: Final = CSRC / "bitcos-kernels-list.h"
# a kernel of every architecture: the baseline flags, in every build
ANY_ARCH: Final = "any"


@dataclass(frozen=True)
class Cross:
    """How to build and run an architecture's kernels on another machine (a cross compiler, user-mode qemu)."""

    cc: str
    runner: tuple[str, ...]
    qemu_cpu: str  # the emulated CPU that has every extension of the architecture's kernels
    qemu_cpu_baseline: str  # one that has none beyond the architecture's baseline
    apt_packages: tuple[str, ...]

    def run_command(self, cpu: str | None = None) -> list[str]:
        """The emulator command that runs a program of this architecture (on `cpu`, default qemu_cpu)."""
        return [*self.runner, "-cpu", cpu or self.qemu_cpu]


@dataclass(frozen=True)
class Mca:
    """How dev/mca.py models an architecture: llvm-mca's triple and default CPUs, the assembler's comment,
    the compiler ("clang": clang 19 cross-compiling for the triple; "host": the compiler the harness library is
    built with), whether each CPU gets its own build (-mcpu, or -mtune beside a kernel's flags), the flags and
    the file of upstream's TQ2_0 vec_dot, and defines of every BITCOS kernel build."""

    triple: str
    cpus: tuple[str, ...]
    asm_comment: str
    compiler: str
    tune_for_cpu: bool
    upstream_quants: str
    upstream_flags: tuple[str, ...]
    defines: tuple[str, ...]


@dataclass(frozen=True)
class Arch:
    name: str
    c_condition: str
    c_condition_why: str
    machines: tuple[str, ...]
    cross: Cross | None
    mca: Mca

    @property
    def macro(self) -> str:
        """BITCOS_ARCH_<NAME>: defined where the compiler's target is this architecture (bitcos-kernels-list.h)."""
        return "BITCOS_ARCH_" + self.name.upper()


@dataclass(frozen=True)
class Kernel:
    name: str
    source: str
    arch: str  # a key of Manifest.arches, or ANY_ARCH
    about: str
    build_condition: str = ""
    flags: tuple[str, ...] = ()
    cpu_check: tuple[tuple[str, Any], ...] = ()
    covers: bool = False
    codes_source: str = ""  # the file of its codes-form kernel ("": none)

    @property
    def ident(self) -> str:
        """The C identifier part: neon-dotprod -> neon_dotprod."""
        return self.name.replace("-", "_")

    @property
    def entry(self) -> str:
        return f"bitcos_mm_{self.ident}"

    @property
    def codes_entry(self) -> str | None:
        """The entry point of its kernel of the 2-bit codes form, None when it has none."""
        return f"bitcos_codes_mm_{self.ident}" if self.codes_source else None

    @property
    def sources(self) -> tuple[str, ...]:
        """Its files: the kernel's, then the codes kernel's (compiled with the same flags)."""
        return (self.source, self.codes_source) if self.codes_source else (self.source,)

    @property
    def covers_fn(self) -> str | None:
        return f"bitcos_covers_{self.ident}" if self.covers else None

    @property
    def build_macro(self) -> str:
        """Defined (to 1) where the compiler's target flags build this kernel (bitcos-kernels-list.h)."""
        return "BITCOS_BUILD_" + self.ident.upper()

    @property
    def table_macro(self) -> str:
        return "BITCOS_TABLE_" + self.ident.upper()

    @property
    def baseline(self) -> bool:
        return self.arch == ANY_ARCH

    def check(self, kind: str) -> Any:
        return dict(self.cpu_check).get(kind)


@dataclass(frozen=True)
class Manifest:
    arches: dict[str, Arch]
    kernels: tuple[Kernel, ...]

    def kernels_of(self, arch: str) -> tuple[Kernel, ...]:
        """The kernels with their own target flags of `arch` (the harness's per-file objects), in table order."""
        return tuple(k for k in self.kernels if k.arch == arch)

    @property
    def baseline_kernels(self) -> tuple[Kernel, ...]:
        return self.kernels_of(ANY_ARCH)

    def arch_of_machine(self, machine: str) -> str | None:
        """The architecture whose `machines` hold `machine` (os.uname().machine, CMAKE_SYSTEM_PROCESSOR)."""
        return next((a.name for a in self.arches.values() if machine in a.machines), None)

    def kernel(self, name: str) -> Kernel:
        return next(k for k in self.kernels if k.name == name)

    def sources(self) -> set[str]:
        return {s for k in self.kernels for s in k.sources}


def _arch(name: str, d: dict[str, Any]) -> Arch:
    c, m = d["cross"], d["mca"]
    cross = (
        None
        if c is None
        else Cross(c["cc"], tuple(c["runner"]), c["qemu_cpu"], c["qemu_cpu_baseline"], tuple(c["apt_packages"]))
    )
    mca = Mca(
        m["triple"],
        tuple(m["cpus"]),
        m["asm_comment"],
        m["compiler"],
        bool(m["tune_for_cpu"]),
        m["upstream_quants"],
        tuple(m["upstream_flags"]),
        tuple(m["defines"]),
    )
    return Arch(name, d["c_condition"], d["c_condition_why"], tuple(d["machines"]), cross, mca)


def _kernel(d: dict[str, Any]) -> Kernel:
    check = tuple((kind, tuple(v) if isinstance(v, list) else v) for kind, v in sorted(d.get("cpu_check", {}).items()))
    return Kernel(
        d["name"],
        d["source"],
        d["arch"],
        d["about"],
        d.get("build_condition", ""),
        tuple(d.get("flags", ())),
        check,
        bool(d.get("covers", False)),
        d.get("codes_source", ""),
    )


def load(path: Path = MANIFEST) -> Manifest:
    """The manifest; ValueError when an entry names an unknown architecture or a name repeats."""
    data = json.loads(path.read_text())
    arches = {name: _arch(name, d) for name, d in data["architectures"].items()}
    kernels = tuple(_kernel(d) for d in data["kernels"])
    names = [k.name for k in kernels]
    if len(set(names)) != len(names):
        raise ValueError(f"{path}: a kernel name repeats: {names}")
    for k in kernels:
        if k.arch != ANY_ARCH and k.arch not in arches:
            raise ValueError(f"{path}: kernel {k.name}: unknown arch {k.arch!r}")
        if k.arch != ANY_ARCH and not k.build_condition:
            raise ValueError(f"{path}: kernel {k.name}: no build_condition")
    if [k.name for k in kernels[:2]] != ["generic", "portable"]:
        raise ValueError(f"{path}: the table starts with generic (index 0, the reference) and portable")
    return manifest_checked(Manifest(arches, kernels))


def manifest_checked(m: Manifest) -> Manifest:
    known = {"x86_cpu_supports", "linux_hwcap", "apple_sysctl"}
    for k in m.kernels:
        unknown = {kind for kind, _ in k.cpu_check} - known
        if unknown:
            raise ValueError(f"kernel {k.name}: unknown cpu_check {sorted(unknown)}")
    return m


# ------------------------------------------------------------------------------------------------- C
_MM_PARAMS: Final = (
    "(const bitcos_rows * w, int64_t nr, const bitcos_q8_K * const * y, int64_t nc, float * const * dst)"
)


_CODES_MM_PARAMS: Final = _MM_PARAMS.replace("bitcos_rows", "bitcos_codes_rows")


def _prototype(entry: str, params: str = _MM_PARAMS) -> list[str]:
    one = f"void {entry}{params};"
    if len(one) <= 120:
        return [one]
    head = f"void {entry}("
    cut = (
        params.index("const bitcos_q8_K")
        if len(head) + params.index("int64_t nc") > 119
        else params.index("int64_t nc")
    )
    return [head + params[1:cut].rstrip(), " " * len(head) + params[cut:] + ";"]


def _comment(text: str, indent: str = "") -> list[str]:
    """`text` as // lines of at most 120 columns."""
    out, line = [], indent + "//"
    for word in text.split():
        if len(line) + 1 + len(word) > 120:
            out.append(line)
            line = indent + "//"
        line += " " + word
    return [*out, line]


def _check_function(k: Kernel) -> list[str]:
    """The run-time test of a per-file-flags build: exactly the extensions k's file is compiled with."""
    fn = f"bitcos_cpu_{k.ident}"
    x86 = k.check("x86_cpu_supports")
    if x86:
        terms = [f'__builtin_cpu_supports("{f}")' for f in x86]
        lines = [f"static int {fn}(void) {{", "    __builtin_cpu_init();"]
        expr = "    return " + terms[0]
        for t in terms[1:]:
            if len(expr) + 4 + len(t) + 1 > 120:
                lines.append(expr + " &&")
                expr = "           " + t
            else:
                expr += " && " + t
        return [*lines, expr + ";", "}"]
    hwcap, sysctl = k.check("linux_hwcap"), k.check("apple_sysctl")
    if hwcap or sysctl:
        out = ["#    if defined(__linux__)" if hwcap else "#    if 0"]
        if hwcap:
            name, bit = hwcap
            out += [
                "#        include <sys/auxv.h>",
                f"#        ifndef {name}",
                f"#            define {name} (1UL << {bit}) // the Linux arm64 ABI's bit (asm/hwcap.h)",
                "#        endif",
                f"static int {fn}(void) {{",
                f"    return (getauxval(AT_HWCAP) & {name}) != 0;",
                "}",
            ]
        if sysctl:
            out += [
                "#    elif defined(__APPLE__)",
                "#        include <sys/sysctl.h>",
                f"static int {fn}(void) {{",
                "    int    v = 0;",
                "    size_t n = sizeof v;",
                f'    return sysctlbyname("{sysctl}", &v, &n, NULL, 0) == 0 && v != 0;',
                "}",
            ]
        out += [
            "#    else",
            f"static int {fn}(void) {{",
            "    return 0; // no portable way to ask: the architecture's other kernels run",
            "}",
            "#    endif",
        ]
        return out
    return []


def render_header(m: Manifest) -> str:
    """The C form of the manifest: csrc/bitcos-kernels-list.h."""
    simd = [k for k in m.kernels if not k.baseline]
    w = max(len(k.table_macro) for k in simd)
    out = [
        "// Generated by dev/kernel_manifest.py from bitcos-kernels.json, the list of the BITCOS CPU kernels: edit the",
        "// manifest and run `python3 -m dev.kernel_manifest`, never this file (tests/test_kernel_manifest.py checks).",
        "//",
        "// Included by bitcos-kernels.h: which architecture the compiler targets (BITCOS_ARCH_*), which kernels its",
        "// target flags build (BITCOS_BUILD_*; each kernel file defines its entry points only under its macro) and",
        "// their entry points. With BITCOS_KERNELS_LIST_TABLE defined (bitcos-kernels-table.c) also the table's",
        "// entries, BITCOS_KERNEL_ENTRIES, in order of preference.",
        "#pragma once",
        "",
    ]
    for a in m.arches.values():
        out += _comment(a.c_condition_why)
        cond = a.c_condition
        if len(f"#if {cond}") > 120:
            parts = cond.split(" && ")
            lines, cur = [], "#if " + parts[0]
            for p in parts[1:]:
                if len(cur) + 4 + len(p) + 2 > 120:
                    lines.append(cur + " &&")
                    cur = "    " + p
                else:
                    cur += " && " + p
            lines.append(cur)
            width = max(len(x) for x in lines[:-1])
            out += [x.ljust(width) + " \\" for x in lines[:-1]] + [lines[-1]]
        else:
            out.append(f"#if {cond}")
        out += [f"#    define {a.macro} 1", "#endif"]
    out.append("")
    for k in simd:
        out += [
            f"#if defined({m.arches[k.arch].macro}) && {k.build_condition}",
            f"#    define {k.build_macro} 1",
            "#endif",
        ]
    out.append("")
    for k in m.kernels:
        out += _comment(f"{k.name} ({k.source}): {k.about}")
        out += _prototype(k.entry)
        if k.codes_entry:
            out += _prototype(k.codes_entry, _CODES_MM_PARAMS)
        if k.covers_fn:
            out.append(f"int {k.covers_fn}(const bitcos_rows * w);")
    out += [
        "",
        "#if defined(BITCOS_KERNELS_LIST_TABLE)",
        "// In a build of every file with one set of flags (ggml-cpu), an entry is there when those flags build its",
        "// kernel, and ggml loads a CPU variant only where its flags run: always available. With",
        "// BITCOS_KERNELS_PER_FILE_FLAGS (each kernel file with its own flags: the harness library, the fuzzer) every",
        "// entry of the architecture is there, and its availability asks the CPU for the extensions of its flags.",
    ]
    for k in simd:
        a = m.arches[k.arch]
        out += [
            f"#    if defined({k.build_macro}) || (defined(BITCOS_KERNELS_PER_FILE_FLAGS) && defined({a.macro}))",
            f"#        define {k.table_macro.ljust(w)} 1",
            "#    endif",
        ]
    for k in simd:
        check = _check_function(k)
        name = f"BITCOS_AVAILABLE_{k.ident.upper()}"
        if not check:
            continue
        out += [
            f"#    if defined(BITCOS_KERNELS_PER_FILE_FLAGS) && defined({k.table_macro})",
            *check,
            f"#        define {name} bitcos_cpu_{k.ident}",
            "#    endif",
        ]
    for k in simd:
        out += [
            f"#    if defined({k.table_macro})",
            f"#        define BITCOS_ENTRY_{k.ident.upper()} \\",
        ]
        avail = f"BITCOS_AVAILABLE_{k.ident.upper()}" if _check_function(k) else "bitcos_always"
        entry = f'            {{ "{k.name}", {avail}, {k.covers_fn or "NULL"}, {k.entry}, {k.codes_entry or "NULL"} }},'
        if len(entry) > 120:
            cut = entry.rindex(", ") + 1
            entry = entry[:cut] + " \\\n              " + entry[cut + 1 :]
        out += [entry, "#    else"]
        out += [f"#        define BITCOS_ENTRY_{k.ident.upper()}", "#    endif"]
        if avail != "bitcos_always":
            out += [
                f"#    ifndef {avail}",
                f"#        define {avail} bitcos_always",
                "#    endif",
            ]
    entries = [
        f'{{ "{k.name}", bitcos_always, {k.covers_fn or "NULL"}, {k.entry}, {k.codes_entry or "NULL"} }},'
        for k in m.baseline_kernels
    ]
    entries += [f"BITCOS_ENTRY_{k.ident.upper()}" for k in simd]
    out.append("#    define BITCOS_KERNEL_ENTRIES \\")
    out += [f"        {e} \\" for e in entries[:-1]] + [f"        {entries[-1]}"]
    out += ["#endif", ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m dev.kernel_manifest", description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only compare: exit 1 when the header is out of date")
    a = ap.parse_args(argv)
    text = render_header(load())
    if a.check:
        same = HEADER.is_file() and HEADER.read_text() == text
        print(f"{HEADER.relative_to(ROOT)}: {'up to date' if same else 'differs from the manifest'}")
        return 0 if same else 1
    HEADER.write_text(text)
    print(f"wrote {HEADER.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
