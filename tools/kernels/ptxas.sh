#!/usr/bin/env bash
# Installs ptxas, NVIDIA's PTX assembler, without a GPU or the CUDA toolkit's installer, so that
# the kernels' PTX is assembled here as a card's driver would assemble it (go test ./cuda -run
# TestPTXAssembles): a syntax error in inline PTX, an instruction a target lacks, a register
# spill or a kernel's register count show before a card is lent, where otherwise the driver
# would say so on the card, failing every kernel of the module.
#
#   bash tools/kernels/ptxas.sh [DIR]     (default DIR /usr/local/bin; or: make ptxas)
#   CUDA_TOOLS="ptxas cuobjdump nvdisasm" bash tools/kernels/ptxas.sh
#                                          (also the disassemblers, to read a kernel's SASS:
#                                           ptxas -arch=sm_90 cuda/ptx/kernels.ptx -o k.cubin;
#                                           cuobjdump -sass -fun mmvq1_q4_K k.cubin)
#
# It takes ptxas alone out of Debian's nvidia-cuda-toolkit package (non-free; CUDA 11.8 in
# bookworm, which knows sm_75 to sm_90), read through a private apt configuration in a
# temporary folder: the machine's apt sources are left as they are, and nothing else of the
# toolkit is installed. Debian and its derivatives only; elsewhere put any ptxas of CUDA 11.8 or
# newer on the PATH, or name it in $PTXAS.
set -euo pipefail
dir=${1:-/usr/local/bin}

if [[ ! -r /etc/os-release ]]; then
	echo "ptxas.sh: no /etc/os-release: not a Debian system (put a ptxas on the PATH instead)" >&2
	exit 1
fi
. /etc/os-release
codename=${VERSION_CODENAME:-}
if [[ ${ID:-} != debian && ${ID_LIKE:-} != *debian* ]] || [[ -z $codename ]]; then
	echo "ptxas.sh: ${PRETTY_NAME:-this system} is not Debian (put a ptxas on the PATH instead)" >&2
	exit 1
fi
if [[ ${ID:-} != debian ]]; then
	codename=bookworm # a derivative's own codename is not a Debian suite
fi

sudo=""
[[ $(id -u) -eq 0 ]] || sudo="sudo"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
chmod 755 "$tmp" # apt's download user must be able to write there
mkdir -p "$tmp/lists/partial" "$tmp/archives/partial"
cat >"$tmp/nonfree.sources" <<EOF
Types: deb
URIs: http://deb.debian.org/debian
Suites: $codename
Components: non-free
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
opts=(-o "Dir::Etc::SourceList=$tmp/nonfree.sources" -o "Dir::Etc::SourceParts=/dev/null"
	-o "Dir::State::Lists=$tmp/lists" -o "Dir::Cache::Archives=$tmp/archives" -o "APT::Sandbox::User=root")
apt-get "${opts[@]}" update -qq
(cd "$tmp" && apt-get "${opts[@]}" download -qq nvidia-cuda-toolkit)
dpkg-deb -x "$tmp"/nvidia-cuda-toolkit_*.deb "$tmp/x"
for tool in ${CUDA_TOOLS:-ptxas}; do
	$sudo install -D -m 755 "$tmp/x/usr/bin/$tool" "$dir/$tool"
done
"$dir/ptxas" --version | tail -n 1
