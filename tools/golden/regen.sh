#!/usr/bin/env bash
# Regenerates the golden fixtures in engine/testdata/golden: writes every synthetic model of
# synth into a temporary folder, runs llama.cpp on each (tools/golden/ref), writes
# one fixture per model, and runs the Go tests that check fixtures against the generator. The
# models with a sliding window also get a long fixture in engine/testdata/golden-long
# (tools/golden/ref/long.mjs: a 900-token prompt and a 300-token continuation).
#
#   tools/golden/regen.sh                 # all models
#   ONLY=mixtral-f32,olmoe-q8_0 tools/golden/regen.sh
#   THREADS=2 tools/golden/regen.sh       # llama.cpp threads (recorded; the Go test uses the same)
#
# Needs Go, node >= 20 and npm (the first run installs node-llama-cpp's prebuilt CPU build,
# linux-x64 only, into tools/golden/ref/node_modules).
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
threads=${THREADS:-2}
only=${ONLY:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cd "$root"
if [ ! -d tools/golden/ref/node_modules/node-llama-cpp ]; then
    # --omit=optional: only the linux-x64 CPU binaries (a direct dependency), not the CUDA and
    # Vulkan builds node-llama-cpp lists as optional.
    (cd tools/golden/ref && npm install --omit=optional --no-audit --no-fund)
fi

synth_args=(-golden -dir "$work/models")
ref_args=(--manifest "$work/models/manifest.json" --out engine/testdata/golden --threads "$threads")
if [ -n "$only" ]; then
    synth_args+=(-only "$only")
    ref_args+=(--only "$only")
else
    # The bundled trained models' fixtures (tinymoe-*) come from tools/tinymoe/golden.sh.
    find engine/testdata/golden -name '*.json.gz' ! -name 'tinymoe-*' -delete
    find engine/testdata/golden-long -name '*.json.gz' -delete 2>/dev/null || true
fi

go run ./tools/golden/cmd/synth "${synth_args[@]}"
node tools/golden/ref/golden.mjs "${ref_args[@]}"
long_args=("${ref_args[@]}")
long_args[3]=engine/testdata/golden-long # --out
node tools/golden/ref/long.mjs "${long_args[@]}"
go test ./tools/golden/...
du -sh engine/testdata/golden
