package quant

import (
	"encoding/binary"
	"math"
	"testing"
)

// The fuzz targets feed arbitrary bytes as quantized rows (and as float32 inputs) of valid
// length: nothing may panic, whatever the scales and quants say. Seeds live in
// testdata/fuzz/<target>/ and in the f.Add calls; run e.g.
//
//	go test -run '^$' -fuzz FuzzVecDot -fuzztime 30s ./quant

// fuzzType picks a type from quantTypes (or weightTypes when weights is set).
func fuzzType(sel uint8, weights bool) Type {
	if weights {
		return weightTypes[int(sel)%len(weightTypes)]
	}
	return quantTypes[int(sel)%len(quantTypes)]
}

// wholeBlocks trims data to whole blocks of typ and returns it with its element count.
func wholeBlocks(typ Type, data []byte) ([]byte, int) {
	nb := len(data) / typ.BlockBytes()
	return data[:nb*typ.BlockBytes()], nb * typ.BlockSize()
}

func FuzzDequantizeRow(f *testing.F) {
	f.Add(uint8(3), make([]byte, 18))
	f.Add(uint8(12), bytesOf(0xff, 300))
	f.Add(uint8(14), bytesOf(0xff, 17*256)) // MXFP4, the largest scale: infinite products
	f.Add(uint8(14), bytesOf(0x01, 17*3))   // MXFP4, subnormal scale
	f.Fuzz(func(t *testing.T, sel uint8, data []byte) {
		typ := fuzzType(sel, false)
		src, n := wholeBlocks(typ, data)
		DequantizeRow(typ, src, make([]float32, n))
	})
}

func FuzzVecDot(f *testing.F) {
	f.Add(uint8(11), bytesOf(0x80, 144+292))
	f.Add(uint8(4), bytesOf(0x7f, 20+36))
	f.Add(uint8(14), bytesOf(0x80, 5*(17+34))) // MXFP4 against activations of -128
	f.Add(uint8(14), bytesOf(0xff, 3*(17+34)))
	f.Fuzz(func(t *testing.T, sel uint8, data []byte) {
		typ := fuzzType(sel, true)
		dt := typ.DotType()
		// Every weight type's block covers as many elements as its dot type's block, so the
		// data splits into pairs of blocks.
		wb, xb := typ.BlockBytes(), dt.BlockBytes()
		blocks := len(data) / (wb + xb)
		w, x := data[:blocks*wb], data[blocks*wb:blocks*(wb+xb)]
		VecDot(typ, blocks*typ.BlockSize(), w, x)
	})
}

func FuzzQuantizeRow(f *testing.F) {
	f.Add(uint8(6), bytesOf(0x41, 128))
	f.Add(uint8(15), bytesOf(0xff, 1024))
	f.Add(uint8(14), bytesOf(0x7f, 4*64))                                // MXFP4: NaNs
	f.Add(uint8(14), append(bytesOf(0x00, 124), 0x00, 0x00, 0x80, 0x7f)) // MXFP4: an infinite largest value
	f.Fuzz(func(t *testing.T, sel uint8, data []byte) {
		typ := fuzzType(sel, false)
		n := len(data) / 4 / typ.BlockSize() * typ.BlockSize()
		src := make([]float32, n)
		for i := range src {
			src[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
		}
		nb, _ := typ.RowBytes(n)
		dst := make([]byte, nb)
		QuantizeRow(typ, src, dst)
		DequantizeRow(typ, dst, make([]float32, n))
	})
}

func bytesOf(b byte, n int) []byte {
	out := make([]byte, n)
	for i := range out {
		out[i] = b
	}
	return out
}
