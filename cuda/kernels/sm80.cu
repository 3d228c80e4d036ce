// sm80.cu: the translation unit of the second PTX module, cuda/ptx/kernels_sm80.ptx (built by
// tools/kernels/build.sh for compute capability 8.0, PTX ISA 7.0): the kernels that sm_80's
// instructions make faster, compiled with CR_SM80 (common.cuh). A GPU of compute capability
// 8.0 or newer loads it beside kernels.ptx and takes these kernels from it; older ones never
// see it. Today: mmqi's tensor-core products on mma.sync.m16n8k32 and m16n8k16, and a prompt's
// flash attention on m16n8k16 halves.
#include "common.cuh"
#include "dequant.cuh"
#include "mmqi.cu"
#include "flash.cu"
