#!/bin/sh
# Builds dev/codes_gemm_bench.c with several builds of the x86 codes kernels and runs it (one thread).
#   dev/codes_gemm_bench.sh [N K NC KIND ROUNDS] [VARIANT ...]
# VARIANT: name=isa:source:defines, isa avx512 | avx2, source a file or git:<rev> (that revision's kernel file),
# defines comma-separated -D definitions. Default: the committed kernel (HEAD) against the working tree's, both ISAs.
# The speed ratios are to the first variant; TQ2_0's vec_dot comes from the installed llama_cpp's libggml-cpu.so.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
N=${1:-2048} K=${2:-2048} NC=${3:-64} KIND=${4:-matrix} ROUNDS=${5:-7}
[ $# -ge 5 ] && shift 5 || set --
[ $# -gt 0 ] || set -- base512=avx512:git:HEAD: new512=avx512:: base2=avx2:git:HEAD: new2=avx2::
out=${TMPDIR:-/tmp}/codes-gemm-bench.$$
mkdir -p "$out"
trap 'rm -rf "$out"' EXIT
flags512="-march=x86-64-v4 -mavx512vnni -mavx512vbmi2 -mavx512bitalg -mavx512vpopcntdq -mbmi2 -mf16c"
flags2="-mavx2 -mfma -mbmi2 -mf16c -mno-avx512f"
common="-O3 -ffp-contract=off -DBITCOS_FMA=1 -I$root/csrc"
CC=${CC:-cc}
objs="" names=""
for spec in "$@"; do
    name=${spec%%=*} rest=${spec#*=}
    isa=${rest%%:*} rest=${rest#*:}
    case $rest in
        git:*) rev=${rest#git:} rev=${rev%%:*} rest=${rest#git:"$rev"}; rest=${rest#:}
               src=$out/$name.c; git -C "$root" show "$rev:csrc/bitcos-kernels-codes-$isa.c" >"$src" ;;
        *) src=${rest%%:*} rest=${rest#"$src"}; rest=${rest#:}
           [ -n "$src" ] || src=$root/csrc/bitcos-kernels-codes-$isa.c ;;
    esac
    defs=$(printf '%s' "$rest" | tr ',' '\n' | sed -n 's/^\(..*\)$/-D\1/p' | tr '\n' ' ')
    [ "$isa" = avx512 ] && fl=$flags512 || fl=$flags2
    # shellcheck disable=SC2086
    $CC $common $fl $defs "-Dbitcos_codes_mm_$isa=$name" -c "$src" -o "$out/$name.o"
    objs="$objs $out/$name.o" names="$names X($name)"
done
# shellcheck disable=SC2086
$CC $common "-DVARIANTS=$names" -o "$out/bench" "$root/dev/codes_gemm_bench.c" \
    "$root/csrc/bitcos-kernels-codes-generic.c" $objs -ldl -lm
lib=$(python3 -c 'import sys; sys.path.insert(0, "'"$root"'/tests"); import tq2_reference as t; print(t.ggml_cpu_library() or "")' 2>/dev/null || true)
"$out/bench" "$N" "$K" "$NC" "$KIND" "$ROUNDS" $lib
