#!/usr/bin/env bash
# Regenerates package tokenizer's fixtures from llama.cpp; see README.md.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=${TOKGOLDEN_WORK:-${TMPDIR:-/tmp}/tokgolden}
cd "$root/tools/tokgolden"
# npm ci refuses this lock file: some of node-llama-cpp's optional per-platform
# packages were never published at its version, so they are not in it.
npm install --no-audit --no-fund
cd "$root"
rm -rf "$work"
go run ./tools/tokgolden -work "$work"
rm -f tokenizer/testdata/golden/*.json
node tools/tokgolden/golden.mjs "$work/manifest.json" tokenizer/testdata
go test ./tokenizer -run TestChatTemplates -update
if python3 -c 'import jinja2' 2>/dev/null; then
	python3 tools/tokgolden/chat_check.py
else
	echo "jinja2 not installed: skipping chat_check.py"
fi
go test ./tokenizer
