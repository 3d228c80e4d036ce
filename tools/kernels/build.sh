#!/usr/bin/env bash
# Builds the CUDA kernels' two PTX modules. Run from anywhere:
#   bash tools/kernels/build.sh        (or: make kernels)
#   - cuda/ptx/kernels.ptx from cuda/kernels/all.cu (which includes every other kernel source),
#     for compute capability 7.5 (PTX ISA 6.5 with clang: the integer mma.sync of mmqi.cu needs
#     it), which the driver JIT-compiles for sm_75 and every newer GPU;
#   - cuda/ptx/kernels_sm80.ptx from cuda/kernels/sm80.cu, for compute capability 8.0 (PTX ISA
#     7.0): the kernels that sm_80's instructions make faster, which a GPU of 8.0 or newer
#     takes from it instead.
# It uses nvcc when it is on the PATH, else clang (clang compiles CUDA device code to PTX
# without the CUDA toolkit). KERNELS_CC=nvcc or KERNELS_CC=clang picks one explicitly.
#
# Each output's first line is "// commit-run kernels sources-sha256:<hex>", the hash of the
# sources (cuda.HashSources, printed by tools/kernels/hash); the second names the compiler and
# flags. The cuda package's tests fail when the sources no longer match that hash.
set -euo pipefail
cd "$(dirname "$0")/../.."

cc=${KERNELS_CC:-}
if [[ -z $cc ]]; then
	if command -v nvcc >/dev/null 2>&1; then cc=nvcc; elif command -v clang >/dev/null 2>&1; then cc=clang; fi
fi
case $cc in
nvcc) version="nvcc $(nvcc --version | grep -i release | sed 's/^.*release/release/')" ;;
clang) version=$(clang --version | head -n 1) ;;
*)
	echo "build.sh: neither nvcc nor clang found (set KERNELS_CC=nvcc or clang)" >&2
	exit 1
	;;
esac

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# compile SRC SM PTXISA: the PTX of SRC for compute capability SM (75, 80) into $tmp/SM.ptx,
# its command line into $tmp/SM.cmd.
compile() {
	local src=$1 sm=$2 isa=$3 flags
	case $cc in
	nvcc) flags=(-ptx "-arch=compute_$sm" -O3) ;;
	clang) flags=(-x cuda "--cuda-gpu-arch=sm_$sm" --cuda-device-only -nocudainc -nocudalib -Xclang -target-feature -Xclang "+ptx$isa" -O3 -Wall -Wextra -S) ;;
	esac
	nice "$cc" "${flags[@]}" -o "$tmp/$sm.ptx" "$src"
	echo "$cc ${flags[*]} $src" >"$tmp/$sm.cmd"
}
compile cuda/kernels/all.cu 75 65
compile cuda/kernels/sm80.cu 80 70

# The hash tool builds package cuda, which embeds the PTX: give it modules to embed on a first
# build.
mkdir -p cuda/ptx
for out in cuda/ptx/kernels.ptx cuda/ptx/kernels_sm80.ptx; do
	[[ -e $out ]] || : >"$out"
done
hash=$(go run ./tools/kernels/hash cuda)
for sm in 75 80; do
	out=cuda/ptx/kernels.ptx
	[[ $sm == 75 ]] || out=cuda/ptx/kernels_sm$sm.ptx
	{
		echo "// commit-run kernels sources-sha256:$hash"
		echo "// built by tools/kernels/build.sh with ${version}: $(cat "$tmp/$sm.cmd")"
		cat "$tmp/$sm.ptx"
	} >"$out"
	echo "wrote $out ($(wc -c <"$out") bytes, $(grep -c '\.entry' "$out") kernels, sources $hash)"
done
