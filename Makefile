# commit-run: the two commands of the README are `make run` and `make test`.
GO ?= go
MODEL ?= models/testdata/tinymoe-qwen2moe.gguf
THREADS ?= 0
BIN := bin/commit-run

.PHONY: run test build bench-cpu golden fuzz vet clean kernels

build:
	$(GO) build -o $(BIN) ./cmd/commit-run

# Chat with the model bundled in the repo.
run: build
	$(BIN) chat -m $(MODEL)

# Every test; no GPU, no Node.js needed.
test:
	$(GO) vet ./...
	$(GO) test -timeout 20m ./...

# Short fuzzing runs of the parsers (longer: make fuzz FUZZTIME=10m).
FUZZTIME ?= 30s
fuzz:
	$(GO) test ./models -run '^$$' -fuzz FuzzOpen -fuzztime $(FUZZTIME)
	$(GO) test ./offload -run '^$$' -fuzz FuzzCache -fuzztime $(FUZZTIME)
	$(GO) test ./trace -run '^$$' -fuzz FuzzReader -fuzztime $(FUZZTIME)

# Decode tokens/s of commit-run vs llama.cpp on a synthetic OLMoE-shaped model (needs Node.js).
bench-cpu:
	bash tools/bench/cpu.sh

# Regenerate the llama.cpp reference outputs (needs Node.js and npm; see tools/golden/README.md):
# the synthetic golden models, then the bundled trained models (tools/tinymoe/README.md).
golden:
	bash tools/golden/regen.sh
	bash tools/tinymoe/golden.sh

# Rebuild the CUDA kernels' PTX (cuda/ptx/kernels.ptx) after editing cuda/kernels/ (nvcc, or clang).
kernels:
	bash tools/kernels/build.sh

clean:
	rm -rf bin
