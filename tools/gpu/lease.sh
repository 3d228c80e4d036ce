#!/usr/bin/env bash
# A lease's checklist in the two device calls it plans (docs/benchmarking.md), prepared so that a
# session with a card runs them as they are. Here first: `make gpu-pack`. Then, from the repo
# root on the lent machine, each with carry ["bin/gpu.tar.xz", ".lcpp"]:
#   bash tools/gpu/lease.sh 1   llama.cpp's CUDA build in the background, beside nvidia-smi,
#                               ptxas, every test of cuda and the engine's CUDA tests, and the
#                               decode and prompt products' benchmarks (5 to 7 minutes)
#   bash tools/gpu/lease.sh 2   right after, on the same warm machine (it finds llama-bench in
#                               /tmp): both engines on the 8-layer OLMoE file, whole card, after
#                               2000 tokens and split, and Nsight Compute on every kernel of a
#                               decoded token and of a 512-token prompt in both (2 to 3 minutes)
# The device tool brings back 8 files of $OUT at most: each call leaves summary-N.txt (every
# stage's last 60 lines but the tests' progress) and logs-N.tar.gz (every log and CSV).
set -u
cd "$(dirname "$0")/../.."
dest=${OUT:-/tmp/gpu-lease}
logs=/tmp/gpu-lease-logs-${1:-}
mkdir -p "$dest" "$logs"
case ${1:-} in
1)
	(OUT=$logs bash tools/gpu/check.sh lcpp >"$logs/lcpp.out" 2>&1) &
	OUT=$logs KERNELS_BENCH='MMVDecode|MMQ' bash tools/gpu/check.sh smi ptxas cuda engine kernels
	wait
	;;
2)
	OUT=$logs VS_SHAPES=olmoe VS_LAYERS=8 VS_TOKENS=32 VS_ROW_WARPS=" " VS_DEPTH=2000 bash tools/gpu/check.sh vs ncudec ncupre
	;;
*)
	echo "usage: bash tools/gpu/lease.sh 1|2" >&2
	exit 2
	;;
esac
# The summary leaves out the tests' progress lines: a failure and the figures stay in view.
for f in "$logs"/*.log "$logs"/lcpp.out; do
	[[ -e $f ]] && { echo "##### $(basename "$f")"; grep -v -e '^=== RUN' -e '^ *--- PASS' -e '^=== PAUSE' -e '^=== CONT' "$f" | tail -n 60; }
done >"$dest/summary-$1.txt"
tar czf "$dest/logs-$1.tar.gz" -C "$logs" .
