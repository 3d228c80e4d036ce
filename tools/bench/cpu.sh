#!/usr/bin/env bash
# make bench-cpu: decode speed of commit-run and llama.cpp on the same synthetic model with a
# realistic expert shape (OLMoE: d_model 2048, 64 experts top-8, expert ffn 1024; fewer layers
# so the file stays small), same threads, in one run, reported as a ratio.
#
#   tools/bench/cpu.sh                   # Q8_0 and Q4_0, 4 layers, every core
#   TYPES=q4_0 LAYERS=2 THREADS=2 TOKENS=32 tools/bench/cpu.sh
#
# Needs Go, node >= 20 and npm (installs node-llama-cpp's CPU build on first use).
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
# q4_0-preset is llama.cpp's Q4_0 preset (Q4_0 throughout, Q6_K output).
types=${TYPES:-q8_0 q4_0-preset}
layers=${LAYERS:-4}
threads=${THREADS:-$(nproc)}
tokens=${TOKENS:-32}
work=${WORK:-$(mktemp -d)}
cd "$root"
if [ ! -d tools/golden/ref/node_modules/node-llama-cpp ]; then
    (cd tools/golden/ref && npm install --omit=optional --no-audit --no-fund)
fi
go build -o bin/commit-run ./cmd/commit-run
prompt=$(seq -s, 100 131)

printf '%-6s %8s %12s %12s %8s\n' type layers commit-run llama.cpp ratio
for ty in $types; do
    model="$work/olmoe-bench-$ty-$layers.gguf"
    if [ ! -f "$model" ]; then
        go run ./tools/golden/cmd/synth -arch olmoe -embd 2048 -experts 64 -topk 8 -ffn 1024 \
            -layers "$layers" -type "$ty" -out "$model" >/dev/null
    fi
    # commit-run: decode tokens/s = (tokens-1) / decode seconds (the first token comes from
    # the prompt pass); F16 KV cache on both sides, llama.cpp's default.
    ours=$(bin/commit-run generate -m "$model" --threads "$threads" --tokens "$prompt" -n "$tokens" \
        --greedy --ignore-eos --json | go run ./tools/bench/tps)
    theirs=$(node tools/golden/ref/bench.mjs "$model" --threads "$threads" --tokens "$tokens" --flash off |
        go run ./tools/bench/tps -field decode_tok_s)
    ratio=$(awk -v a="$ours" -v b="$theirs" 'BEGIN { printf "%.2f", a / b }')
    printf '%-6s %8s %12.1f %12.1f %7sx\n' "$ty" "$layers" "$ours" "$theirs" "$ratio"
done
