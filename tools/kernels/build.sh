#!/usr/bin/env bash
# Builds cuda/ptx/kernels.ptx, the one PTX module of the CUDA kernels, from
# cuda/kernels/all.cu (which includes every other kernel source). Run from anywhere:
#   bash tools/kernels/build.sh        (or: make kernels)
# It uses nvcc when it is on the PATH, else clang (clang compiles CUDA device code to PTX
# without the CUDA toolkit). KERNELS_CC=nvcc or KERNELS_CC=clang picks one explicitly.
# The PTX targets compute capability 7.5 (PTX ISA 6.5 with clang: the integer mma.sync of
# mmqi.cu needs it), which the driver JIT-compiles for sm_75 and every newer GPU.
#
# The output's first line is "// commit-run kernels sources-sha256:<hex>", the hash of the
# sources (cuda.HashSources, printed by tools/kernels/hash); the second names the compiler and
# flags. The cuda package's tests fail when the sources no longer match that hash.
set -euo pipefail
cd "$(dirname "$0")/../.."

src=cuda/kernels/all.cu
out=cuda/ptx/kernels.ptx
cc=${KERNELS_CC:-}
if [[ -z $cc ]]; then
	if command -v nvcc >/dev/null 2>&1; then cc=nvcc; elif command -v clang >/dev/null 2>&1; then cc=clang; fi
fi

tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
case $cc in
nvcc)
	flags=(-ptx -arch=compute_75 -O3)
	version=$(nvcc --version | grep -i release | sed 's/^.*release/release/')
	nice nvcc "${flags[@]}" -o "$tmp" "$src"
	compiler="nvcc $version"
	;;
clang)
	flags=(-x cuda --cuda-gpu-arch=sm_75 --cuda-device-only -nocudainc -nocudalib -Xclang -target-feature -Xclang +ptx65 -O3 -Wall -Wextra -S)
	version=$(clang --version | head -n 1)
	nice clang "${flags[@]}" -o "$tmp" "$src"
	compiler="$version"
	;;
*)
	echo "build.sh: neither nvcc nor clang found (set KERNELS_CC=nvcc or clang)" >&2
	exit 1
	;;
esac

# The hash tool builds package cuda, which embeds the PTX: give it one to embed on a first build.
mkdir -p "$(dirname "$out")"
[[ -e $out ]] || : >"$out"
hash=$(go run ./tools/kernels/hash cuda)
{
	echo "// commit-run kernels sources-sha256:$hash"
	echo "// built by tools/kernels/build.sh with $compiler: $cc ${flags[*]} $src"
	cat "$tmp"
} >"$out"
echo "wrote $out ($(wc -c <"$out") bytes, $(grep -c '\.entry' "$out") kernels, sources $hash)"
