#!/bin/bash
# The peer side by side (docs/PERFORMANCE.md §9): ik_llama.cpp's llama-bench on an IQ2_BN model against this
# project's llama-bench on the same model as TQ2_0, TQ1_0 and BITCOS, in interleaved rounds, one CSV line per run
# (round,model,threads,test,t/s). ik_llama.cpp is built outside this repository from its own source.
#   IK_BENCH=<ik build>/bin/llama-bench IQ2_BN=<model-iq2_bn.gguf> MODELS=<dir with bench e2e's models> dev/ik_peer.sh
set -euo pipefail
IK=${IK_BENCH:?set IK_BENCH to the llama-bench of an ik_llama.cpp build}
IQ=${IQ2_BN:?the model quantized by ik_llama.cpp to IQ2_BN}
OURS=${OURS_BENCH:-$(python3 -c "from ggml_bitcos.llama_tools import tool_path; print(tool_path('llama-bench'))")}
M=${MODELS:-bench-models}/bitnet-2b-z0.42
AVG_TS='import csv, sys
rows = list(csv.DictReader(sys.stdin))
print(rows[-1]["avg_ts"] if rows else "nan")'
run() { # label exe model threads n_prompt n_gen [extra llama-bench args]
    local l=$1 e=$2 m=$3 t=$4 p=$5 n=$6
    shift 6
    local v test=pp$p
    [ "$p" = 0 ] && test=tg$n
    v=$("$e" -m "$m" -t "$t" -p "$p" -n "$n" -r 1 -o csv "$@" 2>/dev/null | python3 -c "$AVG_TS")
    echo "$R,$l,$t,$test,$v"
}
for R in $(seq "${ROUNDS:-2}"); do
    for T in 1 2; do
        run IQ2_BN "$IK" "$IQ" "$T" 0 128
        run TQ2_0 "$OURS" "$M-tq2_0.gguf" "$T" 0 128
        run BITCOS "$OURS" "$M-bitcos.gguf" "$T" 0 128
        run TQ1_0 "$OURS" "$M-tq1_0.gguf" "$T" 0 128
    done
    for T in 2 1; do
        run IQ2_BN "$IK" "$IQ" "$T" 512 0
        [ "$T" = 2 ] && run IQ2_BN-rtr "$IK" "$IQ" "$T" 512 0 -rtr 1
        run TQ2_0 "$OURS" "$M-tq2_0.gguf" "$T" 512 0
        run BITCOS "$OURS" "$M-bitcos.gguf" "$T" 512 0
    done
done
