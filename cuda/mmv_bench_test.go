package cuda

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/commit-run/commit-run/quant"
)

// BenchmarkMMVDecode times decode's matrix-vector products (one token) on matrices of
// Mixtral's expert shapes, 14336 x 4096 (gate, up) and 4096 x 14336 (down), and of OLMoE's,
// 1024 x 2048 and 2048 x 1024 (a small expert's product: what a launch costs beyond its
// reads), and reports how close each kernel comes to the card's memory bandwidth: the issue's
// goal is 60% for Q4_K, Q8_0 and Q6_K. The quantized types run three ways: mmv (float weights
// decoded, float activations), mmvq (integer dot products on the activation quantized
// beforehand; the quantization is a launch of its own, not timed here) and mmvq1 (mmvq's
// arithmetic in a kernel for one token alone, what the engine takes for a decoded token: set
// beside mmvq, it shows what mmvq's registers for 8 tokens cost), the last at 1, 2, 4 and 8
// warps a row (mmvq1_<type>/wN: GPUOptions.RowWarps, the engine's --gpu-row-warps). Before
// them, read_u4 reads the same copies and does nothing else: the rate this card gives a kernel
// that only reads, the ceiling the products' rates sit under.
//
//	weight-GB/s  the matrix's bytes over the time of a product (each weight is read once);
//	%peak        that over the theoretical bandwidth from the memory clock and bus width.
//
// The launches cycle through copies of the matrix that together exceed four times the L2
// cache, so that every product reads its weights from memory, as decode reads an expert
// once per token. Times are the device's, between events around b.N launches. It runs only
// on a CUDA device.
func BenchmarkMMVDecode(b *testing.B) {
	k := openKernels(b)
	if !k.real {
		b.Skip("no CUDA device: the fake driver's emulator has no meaningful timings")
	}
	r := rand.New(rand.NewPCG(2, 2))
	for _, typ := range []quant.Type{quant.Q4_K, quant.Q8_0, quant.Q6_K, quant.Q5_K, quant.Q4_0, quant.F16} {
		for _, shape := range [][2]int{{14336, 4096}, {4096, 14336}, {1024, 2048}, {2048, 1024}} {
			rows, cols := shape[0], shape[1]
			rb, err := typ.RowBytes(cols)
			if err != nil {
				b.Fatal(err)
			}
			data := make([]byte, rows*rb)
			for i := 0; i < 64; i++ {
				quant.QuantizeRow(typ, randF32(r, cols, 1), data[i*rb:(i+1)*rb])
			}
			for i := 64; i < rows; i++ {
				copy(data[i*rb:(i+1)*rb], data[(i%64)*rb:])
			}
			copies := max(2, (4*k.info.L2+len(data)-1)/len(data))
			ws := make([]DevicePtr, copies)
			for i := range ws {
				ws[i] = k.put(b, data)
			}
			dx, dy := k.putF32(b, randF32(r, cols, 1)), k.alloc(b, 4*rows)
			xq := k.quantized(b, dx, 1, cols, typ, true)
			report := func(b *testing.B, sec float64) {
				gbs := float64(len(data)) / sec / 1e9
				b.ReportMetric(gbs, "weight-GB/s")
				if k.info.MemoryBandwidth > 0 {
					b.ReportMetric(100*gbs*1e9/k.info.MemoryBandwidth, "%peak")
				}
			}
			b.Run(fmt.Sprintf("%s/%dx%d/read_u4", typ, rows, cols), func(b *testing.B) {
				out := k.alloc(b, 4*k.info.SMs*8*256/32)
				args := make([]Args, len(ws))
				for i, w := range ws {
					args[i].Ptr(w).Int64(int64(len(data) / 16)).Ptr(out)
				}
				report(b, timeLaunches(b, k, k.function(b, "read_u4"), Dim3{X: k.info.SMs * 8}, Dim3{X: 256}, args))
			})
			type variant struct {
				kernel string
				warps  int
			}
			vs := []variant{{mmvKernels[typ], 1}}
			if mmvqKernels[typ] != "" { // the float types have no integer product
				vs = append(vs, variant{mmvqKernels[typ], 1})
				for _, w := range RowWarpsChoices {
					vs = append(vs, variant{mmvq1Kernels[typ], w})
				}
			}
			for _, v := range vs {
				name := v.kernel
				if v.kernel == mmvq1Kernels[typ] { // mmvq1_<type>/w1 .. /w8, each its own leaf
					name += fmt.Sprintf("/w%d", v.warps)
				}
				b.Run(fmt.Sprintf("%s/%dx%d/%s", typ, rows, cols, name), func(b *testing.B) {
					args := make([]Args, len(ws))
					for i, w := range ws {
						args[i] = productArgs(w, dx, dy, rows, cols, 1)
						if v.kernel != mmvKernels[typ] {
							args[i].Reset().Ptr(w).Ptr(xq.q).Ptr(xq.d).Ptr(xq.s).Ptr(dy).Int(rows).Int(cols).Int(1)
						}
					}
					gx, block := rowDims(rows, v.warps)
					report(b, timeLaunches(b, k, k.function(b, v.kernel), Dim3{X: gx, Y: 1}, block, args))
				})
			}
		}
	}
}
