# commit-run: the two commands of the README are `make run` and `make test`.
GO ?= go
MODEL ?= models/testdata/tinymoe-qwen2moe.gguf
THREADS ?= 0
BIN := bin/commit-run

.PHONY: run test build bench-cpu golden fuzz vet clean kernels ptxas gpu-pack

build:
	$(GO) build -o $(BIN) ./cmd/commit-run

# Chat with the model bundled in the repo.
run: build
	$(BIN) chat -m $(MODEL)

# Every test; no GPU, no Node.js needed. The plain-Go kernels (-tags purego, what a CPU
# without AVX2 or another architecture runs) are tested too, and held to llama.cpp's goldens.
test:
	$(GO) vet ./...
	$(GO) vet -tags purego ./...
	$(GO) test -timeout 20m ./...
	$(GO) test -tags purego ./quant ./cpu ./models
	$(GO) test -tags purego ./engine -run Golden
	$(GO) test -race ./server
	$(GO) test -race ./cmd/commit-run -run 'TestServe'
	$(GO) test -race ./engine -run '$(RACE_ENGINE)'
	$(GO) test -race ./offload

# The engine tests run under the race detector in make test: sessions side by side and
# cancelled, batched decode steps, the offloader's bookkeeping (with package offload's own
# tests, whole): a few seconds
# (TestOffloadKeepsTheNumbers alone takes 2.5 minutes under it on 2 cores).
RACE_ENGINE := TestBadRequests|TestContextLimit|TestPrefixReuse|TestConcurrentSessionsAndCancel|TestClosedModel|TestOffloadBudget|TestOffloadStats|TestCommitComputesWithPredictions|TestBatchedCancelAndClose|TestBatchedOffloadCopiesLess|TestParallelReservesKVCaches

# Short fuzzing runs of the parsers (longer: make fuzz FUZZTIME=10m).
FUZZTIME ?= 30s
fuzz:
	$(GO) test ./models -run '^$$' -fuzz FuzzOpen -fuzztime $(FUZZTIME)
	$(GO) test ./offload -run '^$$' -fuzz FuzzCache -fuzztime $(FUZZTIME)
	$(GO) test ./trace -run '^$$' -fuzz FuzzReader -fuzztime $(FUZZTIME)
	$(GO) test ./sim -run '^$$' -fuzz FuzzParseProfiles -fuzztime $(FUZZTIME)

# Prompt and decode tokens/s of commit-run beside llama.cpp, llama-bench style, on synthetic
# OLMoE and Qwen3-30B-A3B shaped files (tools/bench/cpubench; needs Node.js). It takes long;
# flags through BENCH_FLAGS: -plan lists the runs, -shapes olmoe -tests tg64 runs fewer.
BENCH_FLAGS ?=
bench-cpu: build
	test -d tools/golden/ref/node_modules/node-llama-cpp || \
		(cd tools/golden/ref && npm install --omit=optional --no-audit --no-fund)
	$(GO) run ./tools/bench/cpubench -commit-run $(BIN) $(BENCH_FLAGS)

# Regenerate the llama.cpp reference outputs (needs Node.js and npm; see tools/golden/README.md):
# the synthetic golden models, then the bundled trained models (tools/tinymoe/README.md).
golden:
	bash tools/golden/regen.sh
	bash tools/tinymoe/golden.sh

# Rebuild the CUDA kernels' PTX (cuda/ptx/kernels.ptx and kernels_sm80.ptx) after editing
# cuda/kernels/ (nvcc, or clang).
kernels:
	bash tools/kernels/build.sh

# ptxas, NVIDIA's PTX assembler, from Debian's non-free nvidia-cuda-toolkit (ptxas alone; the
# machine's apt sources untouched): with it, go test ./cuda assembles the PTX as a card's
# driver does (TestPTXAssembles). PTXAS_DIR picks where it goes.
PTXAS_DIR ?= /usr/local/bin
ptxas:
	bash tools/kernels/ptxas.sh $(PTXAS_DIR)

# Binaries for a lent GPU machine, which has no Go: carry bin/gpu.tar.xz (bin/gpu itself is too
# large beside the checkout for a call's 64 MiB) and .lcpp, llama.cpp's source for its CUDA build
# where ../shared/gpu has it, and run tools/gpu/check.sh there, which unpacks them.
gpu-pack:
	if [ -d ../shared/gpu ]; then mkdir -p .lcpp && cp -f ../shared/gpu/* .lcpp/; fi
	mkdir -p bin/gpu
	$(GO) test -c -ldflags='-s -w' -o bin/gpu/cuda.test ./cuda
	$(GO) test -c -ldflags='-s -w' -o bin/gpu/engine.test ./engine
	$(GO) test -c -ldflags='-s -w' -o bin/gpu/cpu.test ./cpu
	$(GO) build -ldflags='-s -w' -o bin/gpu/commit-run ./cmd/commit-run
	$(GO) build -ldflags='-s -w' -o bin/gpu/synth ./tools/golden/cmd/synth
	tar cJf bin/gpu.tar.xz -C bin gpu

clean:
	rm -rf bin
