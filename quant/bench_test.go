package quant

import (
	"math/rand/v2"
	"testing"
)

// The benchmarks report throughput in bytes of the quantized row (weight bytes for VecDot and
// DequantizeRow, float32 input bytes for QuantizeRow), so MB/s compares directly with memory
// bandwidth.

const benchN = 4096

var sinkF32 float32

func benchRows(typ Type) (w, x []byte) {
	r := rand.New(rand.NewPCG(13, 14))
	wb, _ := typ.RowBytes(benchN)
	xb, _ := typ.DotType().RowBytes(benchN)
	w, x = make([]byte, wb), make([]byte, xb)
	QuantizeRow(typ, randomRow(r, benchN, 0.05), w)
	QuantizeRow(typ.DotType(), randomRow(r, benchN, 1), x)
	return w, x
}

func BenchmarkVecDot(b *testing.B) {
	for _, typ := range weightTypes {
		b.Run(typ.String(), func(b *testing.B) {
			w, x := benchRows(typ)
			b.SetBytes(int64(len(w)))
			for b.Loop() {
				sinkF32 = VecDot(typ, benchN, w, x)
			}
		})
	}
}

func BenchmarkDequantizeRow(b *testing.B) {
	out := make([]float32, benchN)
	for _, typ := range weightTypes {
		b.Run(typ.String(), func(b *testing.B) {
			w, _ := benchRows(typ)
			b.SetBytes(int64(len(w)))
			for b.Loop() {
				DequantizeRow(typ, w, out)
			}
		})
	}
}

func BenchmarkQuantizeRow(b *testing.B) {
	x := randomRow(rand.New(rand.NewPCG(15, 16)), benchN, 1)
	for _, typ := range []Type{Q8_0, Q8_1, Q8_K, F16, BF16, Q4_K, Q6_K} {
		b.Run(typ.String(), func(b *testing.B) {
			nb, _ := typ.RowBytes(benchN)
			dst := make([]byte, nb)
			b.SetBytes(4 * benchN)
			for b.Loop() {
				QuantizeRow(typ, x, dst)
			}
		})
	}
}
