#!/usr/bin/env bash
# Regenerates llama.cpp's reference data for the bundled trained models (models/testdata/tinymoe-*.gguf):
#   engine/testdata/golden/tinymoe-*.json.gz   logits of a held-out prompt, greedy continuation,
#                                              tokenization (checked by engine TestGolden)
#   engine/testdata/ppl/tinymoe-*.json         perplexity of the held-out text, window by window
#                                              (checked by engine TestBundledPerplexity)
# Needs Go, node >= 20 and npm (first run installs node-llama-cpp, as tools/golden/regen.sh does).
#   ONLY=tinymoe-mixtral tools/tinymoe/golden.sh    # one model
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
threads=${THREADS:-2}
cd "$root"
if [ ! -d tools/golden/ref/node_modules/node-llama-cpp ]; then
    (cd tools/golden/ref && npm install --omit=optional --no-audit --no-fund)
fi

work=tools/tinymoe/work
if [ ! -f "$work/heldout.u16" ]; then
    go run ./tools/tinymoe/cmd/tinymoe prep -out "$work"
fi
cmp "$work/heldout.txt" models/testdata/war-and-peace-heldout.txt

models=()
for m in models/testdata/${ONLY:-tinymoe-*}.gguf; do
    # Not the Commit Router sidecar files beside the models.
    [[ $m == *.commit-router.gguf ]] || models+=("$m")
done
go run ./tools/tinymoe/cmd/tinymoe manifest -prep "$work" -out "$work/manifest.json" "${models[@]}"
node tools/golden/ref/golden.mjs --manifest "$work/manifest.json" --out engine/testdata/golden --threads "$threads"

mkdir -p engine/testdata/ppl
for m in "${models[@]}"; do
    name=$(basename "$m" .gguf)
    node tools/golden/ref/ppl.mjs --model "$m" --text models/testdata/war-and-peace-heldout.txt \
        --ids "$work/heldout.u16" --window 256 --threads "$threads" > "engine/testdata/ppl/$name.json"
    node -e 'const r = JSON.parse(require("fs").readFileSync(process.argv[1])); console.log(`${process.argv[2]}: llama.cpp perplexity ${r.perplexity.toFixed(4)} over ${r.scored} tokens`)' \
        "engine/testdata/ppl/$name.json" "$name"
done
