#!/usr/bin/env bash
# Trains the Commit Routers of the bundled models (models/testdata/tinymoe-*.commit-router.gguf):
# router inputs and logits recorded on the first TOKENS tokens of the training split (never the
# held-out text), then `commit-run predictor train` with its defaults (Adam 5e-5 halved every
# 5 epochs, 80/20 split with seed 42, early stopping). Needs only Go.
#   ONLY=tinymoe-mixtral TOKENS=100000 tools/tinymoe/predictors.sh
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
tokens=${TOKENS:-100000}
work=tools/tinymoe/work
if [ ! -f "$work/train.txt" ]; then
    go run ./tools/tinymoe/cmd/tinymoe prep -out "$work"
fi
go build -o bin/commit-run ./cmd/commit-run
for m in models/testdata/${ONLY:-tinymoe-*}.gguf; do
    [[ $m == *.commit-router.gguf ]] && continue
    name=$(basename "$m" .gguf)
    bin/commit-run -m "$m" predictor collect --text "$work/train.txt" --max-tokens "$tokens" \
        --window 256 --out "$work/$name.train.trace"
    bin/commit-run -m "$m" predictor train --trace "$work/$name.train.trace"
done
