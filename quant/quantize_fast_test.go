package quant

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"reflect"
	"testing"
)

// The fast activation quantizers of quantRowFast against the Go ones of quantRowRef: the same
// bytes for any input.

func quantFastTypes(t testing.TB) []Type {
	return typesWith(t, quantRowFast[:], func(f func([]float32, []byte)) bool { return f != nil }, "fast quantizers")
}

func checkQuantFast(t *testing.T, typ Type, src []float32) {
	t.Helper()
	n, _ := typ.RowBytes(len(src))
	want, got := make([]byte, n), bytes.Repeat([]byte{0xa5}, n)
	quantRowRef[typ](src, want)
	quantRowFast[typ](src, got)
	if !bytes.Equal(got, want) {
		for i := range want {
			if got[i] != want[i] {
				bs := typ.BlockBytes()
				t.Fatalf("%v: byte %d (block %d, offset %d) = %#x, want %#x", typ, i, i/bs, i%bs, got[i], want[i])
			}
		}
	}
}

// quantEdgeRows returns rows of n values that hit the quantizers' edge cases.
func quantEdgeRows(r *rand.Rand, n int) map[string][]float32 {
	rows := map[string][]float32{}
	fill := func(name string, f func(i int) float32) {
		x := make([]float32, n)
		for i := range x {
			x[i] = f(i)
		}
		rows[name] = x
	}
	nan := float32(math.NaN())
	inf := float32(math.Inf(1))
	fill("normal", func(int) float32 { return float32(r.NormFloat64()) })
	fill("zero", func(int) float32 { return 0 })
	fill("negzero", func(int) float32 { return float32(math.Copysign(0, -1)) })
	fill("one-hot", func(i int) float32 {
		if i%37 == 5 {
			return -3
		}
		return 0
	})
	fill("ties", func(i int) float32 { return float32(i%255-127) * 0.5 }) // x*127/amax lands on .5
	fill("equal-magnitudes", func(i int) float32 { return float32(1 - 2*(i%2)) })
	fill("nan", func(i int) float32 {
		if i%7 == 3 {
			return nan
		}
		return float32(r.NormFloat64())
	})
	fill("all-nan", func(int) float32 { return nan })
	fill("inf", func(i int) float32 {
		if i%11 == 2 {
			return -inf
		}
		return float32(r.NormFloat64())
	})
	fill("huge", func(i int) float32 { return float32(r.NormFloat64()) * 3e38 })
	fill("tiny", func(i int) float32 { return float32(r.NormFloat64()) * 1e-42 })
	fill("fp16-overflow", func(i int) float32 { return float32(r.NormFloat64()) * 1e7 })
	fill("mixed-scale", func(i int) float32 { return float32(r.NormFloat64()) * float32(math.Pow(10, float64(i%40-20))) })
	return rows
}

func TestQuantizeRowFast(t *testing.T) {
	r := rand.New(rand.NewPCG(51, 52))
	for _, typ := range quantFastTypes(t) {
		for _, blocks := range []int{1, 3, 8} {
			for name, x := range quantEdgeRows(r, blocks*typ.BlockSize()) {
				t.Run(typ.String()+"/"+name, func(t *testing.T) { checkQuantFast(t, typ, x) })
			}
		}
	}
}

// TestQuantizeRowUsesFast checks that QuantizeRow runs the fast quantizers where there are:
// their bytes being the same, nothing else would tell.
func TestQuantizeRowUsesFast(t *testing.T) {
	for _, typ := range quantFastTypes(t) {
		if reflect.ValueOf(quantRow[typ]).Pointer() != reflect.ValueOf(quantRowFast[typ]).Pointer() {
			t.Errorf("%v: QuantizeRow does not use the fast quantizer", typ)
		}
	}
}

// FuzzQuantizeRowFast compares the fast quantizers with the Go ones on arbitrary float bits.
func FuzzQuantizeRowFast(f *testing.F) {
	f.Add(uint8(0), bytesOf(0x7f, 4*256))
	f.Add(uint8(1), bytesOf(0xff, 4*256))
	f.Add(uint8(0), bytesOf(0x80, 4*32))
	f.Add(uint8(1), bytesOf(0x00, 4*512))
	f.Fuzz(func(t *testing.T, sel uint8, data []byte) {
		types := quantFastTypes(t)
		typ := types[int(sel)%len(types)]
		n := len(data) / 4 / typ.BlockSize() * typ.BlockSize()
		x := make([]float32, n)
		for i := range x {
			x[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
		}
		checkQuantFast(t, typ, x)
	})
}

// BenchmarkQuantizeRowFast compares the Go and fast activation quantizers on a 2048-value row.
func BenchmarkQuantizeRowFast(b *testing.B) {
	r := rand.New(rand.NewPCG(53, 54))
	x := randomRow(r, 2048, 1)
	for _, typ := range quantFastTypes(b) {
		n, _ := typ.RowBytes(len(x))
		dst := make([]byte, n)
		for _, v := range []struct {
			name string
			f    func([]float32, []byte)
		}{{"go", quantRowRef[typ]}, {"avx2", quantRowFast[typ]}} {
			b.Run(typ.String()+"/"+v.name, func(b *testing.B) {
				b.SetBytes(int64(4 * len(x)))
				for b.Loop() {
					v.f(x, dst)
				}
			})
		}
	}
}
