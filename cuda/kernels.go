package cuda

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"sort"
)

// kernelPTX is the kernels' PTX module, built from kernels/*.cu by tools/kernels/build.sh
// (make kernels). Its first line records the hash of the sources it was built from.
//
//go:embed ptx/kernels.ptx
var kernelPTX []byte

// kernelPTXSM80 is the second module, built from kernels/sm80.cu for compute capability 8.0:
// the kernels that sm_80's instructions make faster.
//
//go:embed ptx/kernels_sm80.ptx
var kernelPTXSM80 []byte

// kernelSources are the CUDA sources of both modules, embedded so that a test can tell whether
// the PTX is stale.
//
//go:embed kernels/*.cu kernels/*.cuh
var kernelSources embed.FS

// PTX returns the kernels' PTX module: one module with every kernel in KernelNames, for
// compute capability 7.5 and newer. The caller must not modify it.
func PTX() []byte { return kernelPTX }

// PTXSM80 returns the module of the kernels rebuilt for compute capability 8.0 and newer
// (today mmqi's, on mma.sync.m16n8k32): some of KernelNames, which a device of 8.0 or newer
// takes from it rather than from PTX(). The caller must not modify it.
func PTXSM80() []byte { return kernelPTXSM80 }

// kernelSet is the kernels loaded into a context: the base module and, on a device of compute
// capability 8.0 or newer, the sm_80 module, whose kernels stand in for the base module's of
// the same name.
type kernelSet struct {
	base, sm80 *Module
	// sm80Err says why the sm_80 module did not load where the device could take it: the
	// base module's kernels serve alone then, slower but the same numbers.
	sm80Err error
}

// loadKernels loads base (PTX(), or a caller's own module) and, where sm80 is not nil and the
// device has compute capability 8.0 or newer, sm80 beside it. Only the base module's failure
// is an error.
func loadKernels(ctx *Context, info Info, base, sm80 []byte) (*kernelSet, error) {
	k := &kernelSet{}
	var err error
	if k.base, err = ctx.LoadModule(base); err != nil {
		return nil, err
	}
	if sm80 != nil && info.Major >= 8 {
		if k.sm80, err = ctx.LoadModule(sm80); err != nil {
			k.sm80, k.sm80Err = nil, fmt.Errorf("the sm_80 kernels: %w", err)
		}
	}
	return k, nil
}

// Function returns the kernel called name: the sm_80 module's where it has one, else the
// base module's.
func (k *kernelSet) Function(name string) (*Function, error) {
	if k.sm80 != nil {
		f, err := k.sm80.Function(name)
		if !errors.Is(err, ErrNotFound) {
			return f, err
		}
	}
	return k.base.Function(name)
}

// Unload releases both modules.
func (k *kernelSet) Unload() error {
	var errs []error
	for _, m := range []*Module{k.sm80, k.base} {
		if m != nil {
			errs = append(errs, m.Unload())
		}
	}
	return errors.Join(errs...)
}

// SourcesHash returns the SHA-256 (hex) of the embedded kernel sources as HashSources
// computes it.
func SourcesHash() (string, error) { return HashSources(kernelSources) }

// HashSources returns the hex SHA-256 over the kernel sources kernels/*.cu and kernels/*.cuh
// of fsys (a view of the cuda directory): for each file in sorted path order, its path (such
// as "kernels/mmv.cu"), a 0 byte, its contents and a 0 byte. tools/kernels/build.sh writes
// this hash into the PTX's first line; the package's tests compare the two.
func HashSources(fsys fs.FS) (string, error) {
	var paths []string
	for _, pat := range []string{"kernels/*.cu", "kernels/*.cuh"} {
		m, err := fs.Glob(fsys, pat)
		if err != nil {
			return "", err
		}
		paths = append(paths, m...)
	}
	if len(paths) == 0 {
		return "", fmt.Errorf("cuda: no kernel sources (kernels/*.cu, kernels/*.cuh)")
	}
	sort.Strings(paths)
	h := sha256.New()
	for _, p := range paths {
		b, err := fs.ReadFile(fsys, p)
		if err != nil {
			return "", err
		}
		h.Write([]byte(p))
		h.Write([]byte{0})
		h.Write(b)
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// KernelNames lists every kernel (extern "C" __global__ function) in the PTX module. Their
// ABIs (parameters, grid and block sizes) are the comments above each in kernels/*.cu.
var KernelNames = []string{
	// mmv.cu: y = W x for ntok <= 8 tokens per pass over W
	"mmv_f32", "mmv_f16", "mmv_bf16",
	"mmv_q4_0", "mmv_q4_1", "mmv_q5_0", "mmv_q5_1", "mmv_q8_0", "mmv_iq4_nl", "mmv_mxfp4",
	"mmv_q2_K", "mmv_q3_K", "mmv_q4_K", "mmv_q5_K", "mmv_q6_K",
	// mmvq.cu: y = W x for ntok <= 8 tokens with the activation quantized (quantize_q8_f32) and
	// integer dot products
	"quantize_q8_f32",
	"mmvq_q4_0", "mmvq_q4_1", "mmvq_q5_0", "mmvq_q5_1", "mmvq_q8_0", "mmvq_iq4_nl", "mmvq_mxfp4",
	"mmvq_q2_K", "mmvq_q3_K", "mmvq_q4_K", "mmvq_q5_K", "mmvq_q6_K",
	// and the same for one token, a kernel of its own so that its registers are one token's
	"mmvq1_q4_0", "mmvq1_q4_1", "mmvq1_q5_0", "mmvq1_q5_1", "mmvq1_q8_0", "mmvq1_iq4_nl", "mmvq1_mxfp4",
	"mmvq1_q2_K", "mmvq1_q3_K", "mmvq1_q4_K", "mmvq1_q5_K", "mmvq1_q6_K",
	// mmq.cu: y = W x for many tokens (prefill), a tiled product reading W once per 64 tokens
	"mmq_f32", "mmq_f16", "mmq_bf16",
	"mmq_q4_0", "mmq_q4_1", "mmq_q5_0", "mmq_q5_1", "mmq_q8_0", "mmq_iq4_nl", "mmq_mxfp4",
	"mmq_q2_K", "mmq_q3_K", "mmq_q4_K", "mmq_q5_K", "mmq_q6_K",
	// mmqi.cu: the same on the tensor cores, 8-bit quants times the quantized activation
	"mmqi_q4_0", "mmqi_q4_1", "mmqi_q5_0", "mmqi_q5_1", "mmqi_q8_0", "mmqi_iq4_nl", "mmqi_mxfp4",
	"mmqi_q2_K", "mmqi_q3_K", "mmqi_q4_K", "mmqi_q5_K", "mmqi_q6_K",
	// and a layer's experts' token groups in one launch (MUL_MAT_ID's shape)
	"mmqi_id_q4_0", "mmqi_id_q4_1", "mmqi_id_q5_0", "mmqi_id_q5_1", "mmqi_id_q8_0", "mmqi_id_iq4_nl", "mmqi_id_mxfp4",
	"mmqi_id_q2_K", "mmqi_id_q3_K", "mmqi_id_q4_K", "mmqi_id_q5_K", "mmqi_id_q6_K",
	// getrows.cu: embedding lookups
	"get_rows_f32", "get_rows_f16", "get_rows_bf16",
	"get_rows_q4_0", "get_rows_q4_1", "get_rows_q5_0", "get_rows_q5_1", "get_rows_q8_0", "get_rows_iq4_nl", "get_rows_mxfp4",
	"get_rows_q2_K", "get_rows_q3_K", "get_rows_q4_K", "get_rows_q5_K", "get_rows_q6_K",
	// norm.cu
	"rms_norm_f32", "rms_norm_strided_f32",
	// elementwise.cu
	"add_f32", "add_rows_f32", "swiglu_f32", "swiglu_oai_f32", "mul_sigmoid_f32", "mul_f32", "scale_f32", "scale_add_f32", "combine_f32",
	"f32_to_f16", "f16_to_f32", "copy_f32", "copy2d_f32", "copy2d_f32_f16",
	"read_u4", // BenchmarkMMVDecode's reference: reading alone
	// router.cu
	"softmax_rows_f32", "sigmoid_f32", "topk_f32", "norm_weights_f32", "commit_weights_f32",
	// rope.cu
	"rope_f32",
	// attention.cu
	"attn_f32", "attn_f16kv", "attn_split_scores_f32", "attn_split_pv_f32", "attn_split_scores_f16kv", "attn_split_pv_f16kv",
	"attn_fa_f16kv_d64", "attn_fa_f16kv_d128", "attn_fa_f16kv_d256", "attn_fa_f16kv_d192v128", "attn_fa_f16kv_latent576",
	// mla.cu: MLA's per-head products
	"mmv_heads_f32", "mmv_heads_f16", "mmv_heads_bf16",
	"mmv_heads_q4_0", "mmv_heads_q4_1", "mmv_heads_q5_0", "mmv_heads_q5_1", "mmv_heads_q8_0", "mmv_heads_iq4_nl", "mmv_heads_mxfp4",
	"mmv_heads_q2_K", "mmv_heads_q3_K", "mmv_heads_q4_K", "mmv_heads_q5_K", "mmv_heads_q6_K",
	// moe.cu
	"combine_off_f32", "add_rows_id_f32", "gated_add_f32", "moe_group_ids",
	// deltanet.cu: a gated DeltaNet layer between its products
	"deltanet_conv_f32", "deltanet_prep_f32", "deltanet_rec_f32", "deltanet_norm_f32",
	// fused.cu: a decode step's runs of operations, one launch each
	"add_rms_norm_f32", "rope_kv_f32", "kv_store_f32", "moe_route_f32",
	"mmv3_f32", "mmv3_f16", "mmv3_bf16",
	"mmv3_q4_0", "mmv3_q4_1", "mmv3_q5_0", "mmv3_q5_1", "mmv3_q8_0", "mmv3_iq4_nl", "mmv3_mxfp4",
	"mmv3_q2_K", "mmv3_q3_K", "mmv3_q4_K", "mmv3_q5_K", "mmv3_q6_K",
	"moe_up_f32", "moe_up_f16", "moe_up_bf16",
	"moe_up_q4_0", "moe_up_q4_1", "moe_up_q5_0", "moe_up_q5_1", "moe_up_q8_0", "moe_up_iq4_nl", "moe_up_mxfp4",
	"moe_up_q2_K", "moe_up_q3_K", "moe_up_q4_K", "moe_up_q5_K", "moe_up_q6_K",
	"moe_down_f32", "moe_down_f16", "moe_down_bf16",
	"moe_down_q4_0", "moe_down_q4_1", "moe_down_q5_0", "moe_down_q5_1", "moe_down_q8_0", "moe_down_iq4_nl", "moe_down_mxfp4",
	"moe_down_q2_K", "moe_down_q3_K", "moe_down_q4_K", "moe_down_q5_K", "moe_down_q6_K",
}
