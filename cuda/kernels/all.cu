// all.cu: the one translation unit of the PTX module cuda/ptx/kernels.ptx (built by
// tools/kernels/build.sh): every kernel file, in one module that the CUDA device loads once.
#include "common.cuh"
#include "dequant.cuh"
#include "mmv.cu"
#include "mmq.cu"
#include "getrows.cu"
#include "norm.cu"
#include "elementwise.cu"
#include "router.cu"
#include "rope.cu"
#include "attention.cu"
#include "mla.cu"
#include "moe.cu"
