#!/usr/bin/env bash
# Runs the checks that need a GPU, on a lent machine that has the CUDA toolkit but no Go, from the
# binaries `make gpu-pack` builds into bin/gpu (packed as bin/gpu.tar.xz, which this script
# unpacks) and the llama.cpp source it copies into .lcpp (carry bin/gpu.tar.xz and .lcpp). From
# the repo root:
#   bash tools/gpu/check.sh [STAGE ...]      (default: smi ptxas cuda engine kernels host offload profile ncu;
#                                             logs under $OUT or /tmp/gpu-check)
# Stages: smi ptxas cuda engine kernels host offload profile ncu, and lcpp vs ncudec ncupre. Each writes STAGE.log and goes on
# after a failure, so that one call of a short lease gathers everything.
# llama.cpp's CUDA backend beside commit-run (issue 35) takes two calls on the same warm machine:
# `check.sh lcpp` builds llama-bench for the card (5-7 minutes of its 16 cores), then `check.sh vs`
# times both engines on the same synthetic files and prints one table (tools/gpu/vs.py).
# A dry run on a machine without a GPU: CUDA_LIB names a driver library for cuda:0 (the fake one
# the tests build) and OFFLOAD_MODEL a small model for the offload stage in place of OLMoE's shape,
# with OFFLOAD_MEM its budget (the bundled model: 10MiB).
set -u
cd "$(dirname "$0")/../.."
root=$PWD
bin=$root/bin/gpu
[[ -d $bin || ! -e $bin.tar.xz ]] || tar xJf "$bin.tar.xz" -C "$root/bin" || exit 1
out=${OUT:-/tmp/gpu-check}
mkdir -p "$out"
stages=("$@")
[[ ${#stages[@]} -gt 0 ]] || stages=(smi ptxas cuda engine kernels host offload profile ncu)

smi() {
	nvidia-smi
	nvidia-smi --query-gpu=name,memory.total,pcie.link.gen.current,pcie.link.width.current,pcie.link.gen.max,pcie.link.width.max --format=csv
}

# The committed PTX is clang's: NVIDIA's assembler must take each module for the oldest and the
# newest target it serves, as the driver's JIT does (the sm_80 module from sm_80 on).
ptxas_check() {
	for arch in sm_75 sm_89 sm_90; do
		ptxas -arch=$arch -O3 cuda/ptx/kernels.ptx -o /dev/null && echo "ptxas kernels.ptx $arch: ok"
	done
	for arch in sm_80 sm_89 sm_90; do
		ptxas -arch=$arch -O3 cuda/ptx/kernels_sm80.ptx -o /dev/null && echo "ptxas kernels_sm80.ptx $arch: ok"
	done
	# Registers per thread bound how many warps an SM keeps in flight, and so a decode
	# product's bandwidth: each kernel's count and spills on this card's architecture.
	local arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n1 | tr -d .)
	echo "== registers per thread on sm_${arch:-90} (kernel, registers, spill stores/loads in bytes)"
	for ptx in cuda/ptx/kernels.ptx cuda/ptx/kernels_sm80.ptx; do
		ptxas -arch=sm_${arch:-90} -O3 -v $ptx -o /dev/null 2>&1 | awk -v mod=$(basename $ptx .ptx) '
			/Compiling entry function/ { name = $7; gsub(/\047/, "", name) }
			/bytes stack frame/ { spill = $5 "/" $9 }
			/Used [0-9]+ registers/ { for (i = 1; i < NF; i++) if ($(i+1) == "registers,") printf "%-32s %4d  %-9s %s\n", name, $i, spill, mod }'
	done | sort -k2,2nr
}

# Every test of the two packages on the real driver: cuda's kernel tests take it when they see a
# device; engine's tests that compute on cuda:0 take it with -gpu=system (those of the fake's own
# limits, its 1 GiB and its several devices, keep the fake).
cuda_tests() { (cd cuda && "$bin/cuda.test" -test.v -test.count=1 -test.timeout 9m); }
engine_tests() { (cd engine && "$bin/engine.test" -test.v -test.count=1 -test.timeout 9m -test.run 'CUDA|GPU|Device' -gpu=system); }

# Decode's bandwidth (goal 60% of peak for Q4_K and Q8_0), a decoded token's attention at growing
# contexts, prefill's mmq against mmv, and a Qwen3.6 DeltaNet layer's kernels on a token and on a
# prompt; then a prompt's attention at 512 to 4096 tokens, attn_f16kv against the tensor-core
# flash kernel (20 passes each: a pass of attn_f16kv at 4096 tokens takes milliseconds).
# KERNELS_BENCH narrows the first set to those benchmarks (a lease's short call: 'MMVDecode|MMQ'),
# and then the prompt's attention is left out.
kernels() {
	local rc=0
	(cd cuda && "$bin/cuda.test" -test.run '^$' -test.bench "${KERNELS_BENCH:-MMVDecode|AttnDecode|MMQ|DeltaNet}" -test.benchtime 200x) || rc=1
	[[ -n ${KERNELS_BENCH:-} ]] && return $rc
	(cd cuda && "$bin/cuda.test" -test.run '^$' -test.bench 'AttnPrefill' -test.benchtime 20x) || rc=1
	return $rc
}

# The host's product at 1 to 32 tokens: what device.HostRates model for cpu-miss on this machine,
# with the weights in the caches (warm) and read from memory as an expert's are (cold).
host_rates() { (cd cpu && "$bin/cpu.test" -test.run '^$' -test.bench HostMatMulBatch -test.benchtime 20x); }

# The simulated card to set against this one: its own profile when sim/profiles has one (matched
# by name as engine's profileOfKind matches it: "NVIDIA H200" is h200), else h100-pcie.
card_profile() {
	local n=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1 | tr 'A-Z' 'a-z' | sed 's/nvidia//g; s/geforce//g; s/[ -]//g')
	for f in sim/profiles/*.json; do
		local k=$(basename "$f" .json)
		if [[ -n $n && ${k//-/} == "$n" ]]; then
			echo "$k"
			return
		fi
	done
	echo h100-pcie
}

# The policies on a real shape at Q4_K with random weights, the budget well below the
# experts, on the GPU and on its simulated profile (card_profile) for calibration: ondemand,
# prefetch, commit, cpu-miss, hot, and llama.cpp's split (static) with the experts of three
# quarters of the MoE layers on the host, which leaves the device layers' experts room in
# the budget.
offload() {
	local m=${OFFLOAD_MODEL:-/tmp/olmoe-q4k.gguf}
	[[ -e $m ]] || "$bin/synth" -arch olmoe -layers 8 -type q4_k -out $m || return
	local size=$(stat -c %s $m)
	# Half the file: with a 512-position KV cache about 37% of the 512 experts fit beside the
	# resident weights (at the model's own 4096 positions the cache leaves 7%, every token misses
	# every expert and the policies cannot differ).
	local mem=${OFFLOAD_MEM:-$((size * 50 / 100 / 1048576))MiB}
	local prof=$(card_profile)
	local n=$("$bin/commit-run" inspect --json $m | python3 -c "import json,sys;d=json.load(sys.stdin);print((d['layers']-d['dense_layers'])*3//4)")
	for dev in cuda:0 sim:$prof; do
		echo "== $dev, --gpu-mem $mem of $((size / 1048576)) MiB, static at --cpu-moe-layers $n"
		"$bin/commit-run" -m $m --ctx 512 --device $dev ${CUDA_LIB:+--cuda-lib "$CUDA_LIB"} --gpu-mem $mem --cpu-moe-layers $n \
			bench --policy ondemand,prefetch,commit,cpu-miss,hot,static --predictor prev-token --tokens 64 --json >"$out/offload-${dev%%:*}.json"
	done
	# Every figure of both runs, then the calibration: simulated against measured per policy,
	# and the copy stream's rate against the profile's.
	if command -v python3 >/dev/null; then
		python3 tools/gpu/compare.py "$out/offload-cuda.json" "$out/offload-sim.json" sim/profiles/$prof.json
	else
		echo "no python3: compare $out/offload-cuda.json and $out/offload-sim.json by hand"
	fi
}

# Where a prompt's pass and a decoded token spend the card's time, kernel by kernel (bench
# --kernel-profile), with the whole model on the card: an OLMoE-shaped Q4_K_M file
# of 8 layers (PROFILE_SHAPES, PROFILE_LAYERS to change it), a 512-token prompt; then tokens
# decoded after PROFILE_DEPTH (4000), where a token's attention reads that many positions.
profile() {
	local layers=${PROFILE_LAYERS:-8} depth=${PROFILE_DEPTH:-4000}
	for shape in ${PROFILE_SHAPES:-olmoe}; do
		local m=/tmp/profile-$shape-$layers.gguf
		[[ -e $m ]] || "$bin/synth" -arch $shape -layers $layers -type q4km -out $m || continue
		echo "== $shape"
		"$bin/commit-run" -m $m --device cuda:0 ${CUDA_LIB:+--cuda-lib "$CUDA_LIB"} --ctx 1024 bench --prompt-len 512 --tokens 16 --kernel-profile
		echo "== $shape, decoding after $depth tokens"
		"$bin/commit-run" -m $m --device cuda:0 ${CUDA_LIB:+--cuda-lib "$CUDA_LIB"} --ctx $((depth + 96)) bench --prompt-len $depth --tokens 16 \
			--kernel-profile
	done
}

# Why a decode product takes the time it does, from Nsight Compute where the toolkit has it and
# the machine lets it read the counters: throughput against the card's peaks, occupancy and the
# warps' stall reasons of BenchmarkMMVDecode's Q4_K down shape (read_u4 alone, mmvq1 with a warp
# a row, then with four), of BenchmarkAttnDecode's OLMoE heads at 2048 positions (a block a
# head, then the split kernels), of BenchmarkAttnPrefill's flash kernels on a 2048-token OLMoE
# prompt and on DeepSeek-V2-Lite's latent cache, and of a decoded token's moe_up and moe_down
# (whatever their types) on the OLMoE shape.
ncu_stage() {
	command -v ncu >/dev/null || { echo "no ncu on this machine"; return 1; }
	local sections=(--section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis)
	# KERNEL|LAUNCHES|BENCHMARK: each benchmark's first launches are the warm-up (for the
	# products, over the weights' copies); the third step is one of them, out of the L2.
	for b in 'read_u4|1|MMVDecode/Q4_K/4096x14336/read_u4$' 'mmvq1_q4_K|1|MMVDecode/Q4_K/4096x14336/mmvq1_q4_K/w1$' \
		'mmvq1_q4_K|1|MMVDecode/Q4_K/4096x14336/mmvq1_q4_K/w4$' 'attn_f16kv|1|AttnDecode/olmoe/n=2048/one$' \
		'regex:^attn_split_|2|AttnDecode/olmoe/n=2048/split' 'attn_fa_f16kv_d128|1|AttnPrefill/olmoe/n=2048/flash$' \
		'attn_fa_f16kv_latent576|1|AttnPrefill/dsv2lite-mla/n=2048/flash$'; do
		local kernel=${b%%|*} rest=${b#*|}
		local count=${rest%%|*} bench=${rest#*|}
		echo "== $bench"
		(cd cuda && ncu "${sections[@]}" --kernel-name "$kernel" --launch-skip $((2 * count)) --launch-count "$count" "$bin/cuda.test" \
			-test.run '^$' -test.bench "$bench" -test.benchtime 3x)
	done
	local m=/tmp/profile-olmoe-8.gguf
	[[ -e $m ]] || "$bin/synth" -arch olmoe -layers 8 -type q4km -out $m || return 1
	for w in 1 4; do
		echo "== moe_up and moe_down of a decoded token, --gpu-row-warps $w"
		ncu "${sections[@]}" --kernel-name regex:'^moe_(up|down)_' --launch-skip 40 --launch-count 2 \
			"$bin/commit-run" -m $m --device cuda:0 --ctx 256 --no-graphs --gpu-row-warps $w bench --prompt-len 16 --tokens 8 --warmup-prompt=false
	done
}

# A decoded token's kernels, each launch's device time from Nsight Compute (graph nodes one by
# one), for commit-run and for llama.cpp on the same OLMoE-shaped file, whole model on the card:
# where the time of a token goes in both (tools/gpu/kernsum.py), the kernels' own time against
# what lies between them. Needs llama-bench (the lcpp stage) for its half.
ncudec() {
	command -v ncu >/dev/null || { echo "no ncu on this machine"; return 1; }
	local m=/tmp/vs-olmoe.gguf
	[[ -e $m ]] || "$bin/synth" -arch olmoe ${VS_LAYERS:+-layers $VS_LAYERS} -type q4km -out $m || return 1
	local q=(ncu --clock-control none --csv --print-units base --metrics gpu__time_duration.sum)
	# One-token prompts and no warm-up: every step of the run is a decode step, and there are
	# as many as the prompts' tokens (bench's built-in prompts times --tokens).
	"${q[@]}" --log-file "$out/ncudec-ours.csv" "$bin/commit-run" -m $m --device cuda:0 --ctx 256 bench --prompt-len 1 \
		--tokens ${NCUDEC_TOKENS:-2} --warmup-prompt=false --json >"$out/ncudec-ours.json" || return 1
	local steps=$(python3 -c "import json;d=json.load(open('$out/ncudec-ours.json'));print(d['Prompts']*d['Tokens'])")
	[[ -x /tmp/lcpp-build/bin/llama-bench ]] || { echo "no llama-bench: run check.sh lcpp first on this machine"; return 1; }
	LD_LIBRARY_PATH=/tmp/lcpp-build/bin "${q[@]}" --log-file "$out/ncudec-lcpp.csv" /tmp/lcpp-build/bin/llama-bench -m $m -ngl 99 \
		-fa on -p 0 -n 8 -r 1 --no-warmup >"$out/ncudec-lcpp.json" || return 1
	python3 tools/gpu/kernsum.py "$out/ncudec-ours.csv" $steps "$out/ncudec-lcpp.csv" 8
}

# A prompt's kernels, as ncudec a decoded token's: each launch of one NCUPRE_LEN-token prompt
# (512) of the same file, whole model on the card, in both engines. commit-run's prompt is its
# run's first launches (bench runs no kernel before it without a warm-up prompt), as many as its
# kernel profile counts in a prompt's pass (a run without ncu); llama-bench runs -p alone, once.
ncupre() {
	command -v ncu >/dev/null || { echo "no ncu on this machine"; return 1; }
	local m=/tmp/vs-olmoe.gguf len=${NCUPRE_LEN:-512}
	[[ -e $m ]] || "$bin/synth" -arch olmoe ${VS_LAYERS:+-layers $VS_LAYERS} -type q4km -out $m || return 1
	local run=("$bin/commit-run" -m $m --device cuda:0 --ctx $((len + 64)) bench --prompt-len $len --tokens 2 --warmup-prompt=false)
	"${run[@]}" --kernel-profile --json >"$out/ncupre-profile.json" || return 1
	local n=$(python3 -c "import json;d=json.load(open('$out/ncupre-profile.json'));print(round(sum(k['Calls'] for k in d['Rows'][0]['Kernels']['Prefill'])))")
	echo "== commit-run: $n launches a $len-token prompt"
	local q=(ncu --clock-control none --csv --print-units base --metrics gpu__time_duration.sum)
	"${q[@]}" --launch-count $n --log-file "$out/ncupre-ours.csv" "${run[@]}" >/dev/null || return 1
	[[ -x /tmp/lcpp-build/bin/llama-bench ]] || { echo "no llama-bench: run check.sh lcpp first on this machine"; return 1; }
	LD_LIBRARY_PATH=/tmp/lcpp-build/bin "${q[@]}" --log-file "$out/ncupre-lcpp.csv" /tmp/lcpp-build/bin/llama-bench -m $m -ngl 99 \
		-fa on -p $len -n 0 -r 1 --no-warmup >"$out/ncupre-lcpp.json" || return 1
	python3 tools/gpu/kernsum.py "$out/ncupre-ours.csv" 1 "$out/ncupre-lcpp.csv" 1
}

# llama.cpp's CUDA backend: built from the source `make gpu-pack` copied into .lcpp, into
# /tmp/lcpp-build, where the next call on the same machine finds it.
lcpp=$root/.lcpp
lcpp_build() { OUT=$out/lcpp bash "$lcpp/llamacpp-bench.sh" build; }

# peak_mib runs a command while sampling the card's used memory, and prints the peak above what
# was used before it, in MiB, to peak.txt under $out.
peak_mib() {
	local q='nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits'
	local base=$($q | head -n1)
	(while :; do $q | head -n1; sleep 0.2; done) >/tmp/gpu-mem.log &
	local sampler=$!
	"$@"
	local rc=$?
	kill $sampler
	echo $(($(sort -n /tmp/gpu-mem.log | tail -n1) - base)) >"$out/peak.txt"
	return $rc
}

# vs: llama.cpp and commit-run on the same synthetic GGUFs (OLMoE- and Qwen3-30B-A3B-shaped,
# synth's Q4_K_M mix; VS_SHAPES, VS_LAYERS to change them), prompts of 512 tokens and VS_TOKENS
# decoded: the whole model on the card; then llama.cpp's --n-cpu-moe N (half the layers) and
# commit-run's static (the same split), hot, cpu-miss and auto with the device memory that
# llama.cpp's run took at its peak (sampled with nvidia-smi); then a prompt of VS_DEPTH tokens
# (4000; OLMoE's context is 4096) and 64 tokens decoded after it, on the card.
vs() {
	local tokens=${VS_TOKENS:-64}
	[[ -x /tmp/lcpp-build/bin/llama-bench ]] || { echo "no llama-bench: run check.sh lcpp first on this machine"; return 1; }
	for shape in ${VS_SHAPES:-olmoe qwen3moe}; do
		local m=/tmp/vs-$shape.gguf
		[[ -e $m ]] || "$bin/synth" -arch $shape ${VS_LAYERS:+-layers $VS_LAYERS} -type q4km -out $m || continue
		"$bin/commit-run" inspect --json $m >"$out/vs-$shape-info.json" || continue
		# Every layer of these shapes is a MoE layer: --n-cpu-moe and --cpu-moe-layers count the same.
		local n=$(python3 -c "import json;print(json.load(open('$out/vs-$shape-info.json'))['layers']//2)")
		OUT=$out/lcpp-$shape bash "$lcpp/llamacpp-bench.sh" bench $m
		LD_LIBRARY_PATH=/tmp/lcpp-build/bin peak_mib /tmp/lcpp-build/bin/llama-bench -m $m -ngl 99 -ncmoe $n -fa on -p 512 -n 128 -r 3 \
			-o json >"$out/lcpp-$shape/bench-ncmoe$n.json"
		local mem=$(cat "$out/peak.txt")
		echo "== $shape: --n-cpu-moe $n took $mem MiB"
		"$bin/commit-run" -m $m --device cuda:0 --ctx 1024 bench --prompt-len 512 --tokens $tokens --json >"$out/vs-$shape-card.json"
		# The same without bench's warm-up prompt: what the first prompt's one-time costs add.
		"$bin/commit-run" -m $m --device cuda:0 --ctx 1024 bench --prompt-len 512 --tokens 4 --warmup-prompt=false --json >"$out/vs-$shape-cold.json"
		# Decode with each row of the integer products over several warps (--gpu-row-warps):
		# which the engine should take on this card.
		for w in ${VS_ROW_WARPS:-2 4}; do
			"$bin/commit-run" -m $m --device cuda:0 --ctx 1024 --gpu-row-warps $w bench --prompt-len 512 --tokens $tokens --json >"$out/vs-$shape-card-w$w.json"
		done
		"$bin/commit-run" -m $m --device cuda:0 --ctx 1024 --gpu-mem ${mem}MiB --cpu-moe-layers $n bench --policy static,hot,cpu-miss,auto \
			--prompt-len 512 --tokens $tokens --json >"$out/vs-$shape-budget.json"
		# Decode at a long context, the whole model on the card: llama-bench's tg64 with VS_DEPTH
		# tokens in the cache (-d) against commit-run's 64 tokens after a prompt of as many,
		# where each decoded token's attention reads the whole cache (split over it, attn_split_*).
		# The same prompt of VS_DEPTH tokens prefilled from an empty cache (llama-bench's pp of as
		# many, against the prompt's time to first token here): a long prompt's attention, on the
		# tensor cores in both (flash attention).
		local depth=${VS_DEPTH:-4000}
		LD_LIBRARY_PATH=/tmp/lcpp-build/bin /tmp/lcpp-build/bin/llama-bench -m $m -ngl 99 -fa on -p 0 -n 64 -d $depth -r 3 -o json \
			>"$out/lcpp-$shape/bench-d$depth.json"
		LD_LIBRARY_PATH=/tmp/lcpp-build/bin /tmp/lcpp-build/bin/llama-bench -m $m -ngl 99 -fa on -p $depth -n 0 -r 3 -o json \
			>"$out/lcpp-$shape/bench-pp$depth.json"
		"$bin/commit-run" -m $m --device cuda:0 --ctx $((depth + 96)) bench --prompt-len $depth --tokens 64 --json >"$out/vs-$shape-d$depth.json"
	done
	python3 tools/gpu/vs.py "$out" ${VS_SHAPES:-olmoe qwen3moe}
}

for s in "${stages[@]}"; do
	case $s in
	smi) f=smi ;;
	ptxas) f=ptxas_check ;;
	cuda) f=cuda_tests ;;
	engine) f=engine_tests ;;
	kernels) f=kernels ;;
	host) f=host_rates ;;
	offload) f=offload ;;
	profile) f=profile ;;
	ncu) f=ncu_stage ;;
	ncudec) f=ncudec ;;
	ncupre) f=ncupre ;;
	lcpp) f=lcpp_build ;;
	vs) f=vs ;;
	*) echo "check.sh: unknown stage $s" >&2; exit 2 ;;
	esac
	echo "== $s"
	$f >"$out/$s.log" 2>&1
	echo "rc=$?" >>"$out/$s.log"
	tail -n 15 "$out/$s.log"
done
