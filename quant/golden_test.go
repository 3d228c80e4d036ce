package quant

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
	"testing"
)

// testdata/golden.bin.gz is written by tools/quantref (see its README) from llama.cpp's own C
// code. After the magic "QREF" and a u32 version it is a stream of records, all little-endian:
//
//	u8 kind, u32 ggml type, u32 n (elements), then by kind:
//	1 dequant:  blob src (quantized row), blob dst (n float32 from dequantize_row_*)
//	2 actq:     blob src (n float32), blob dst (the x86 CPU backend's from_float output)
//	3 vecdot:   blob w (weight row), blob x (activation row in the dot type),
//	            f32 generic kernel result, f32 AVX2 kernel result
//	4 refq:     blob src (n float32), blob dst (ggml's quantize_row_*_ref output)
//	5 hash:     u64 FNV-1a of a conversion sweep (the type field says which, see below)
//	0 end
//
// where a blob is a u32 byte length followed by the bytes.

const (
	recEnd = iota
	recDequant
	recActQ
	recVecDot
	recRefQ
	recHash
)

const (
	hashF16ToF32Compute = 1 // ggml_compute_fp16_to_fp32 over all 65536 halves
	hashF16ToF32F16C    = 2 // _cvtsh_ss over all 65536 halves
	hashF32ToF16F16C    = 3 // _cvtss_sh(x, 0) over the conversion sweep
	hashF32ToF16Compute = 4 // ggml_compute_fp32_to_fp16 over the sweep
	hashF32ToBF16       = 5 // ggml_compute_fp32_to_bf16 over the sweep
	hashMXFP4RefQ       = 6 // quantize_row_mxfp4_ref over the MXFP4 scale sweep (mxfp4Sweep)
)

type goldenRecord struct {
	kind    int
	typ     Type
	n       int
	a, b    []byte
	generic float32
	simd    float32
	hash    uint64
}

var goldenCache struct {
	recs []goldenRecord
	err  error
	done bool
}

func loadGolden(t testing.TB) []goldenRecord {
	t.Helper()
	if !goldenCache.done {
		goldenCache.recs, goldenCache.err = readGolden("testdata/golden.bin.gz")
		goldenCache.done = true
	}
	if goldenCache.err != nil {
		t.Fatalf("golden fixtures: %v (regenerate with `make -C tools/quantref`)", goldenCache.err)
	}
	return goldenCache.recs
}

func readGolden(path string) ([]goldenRecord, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return nil, err
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		return nil, err
	}
	r := bytes.NewReader(raw)
	var magic [4]byte
	var version uint32
	if _, err := io.ReadFull(r, magic[:]); err != nil || string(magic[:]) != "QREF" {
		return nil, fmt.Errorf("bad magic")
	}
	if err := binary.Read(r, binary.LittleEndian, &version); err != nil || version != 1 {
		return nil, fmt.Errorf("unsupported version %d", version)
	}
	blob := func() ([]byte, error) {
		var n uint32
		if err := binary.Read(r, binary.LittleEndian, &n); err != nil {
			return nil, err
		}
		b := make([]byte, n)
		_, err := io.ReadFull(r, b)
		return b, err
	}
	var recs []goldenRecord
	for {
		kind, err := r.ReadByte()
		if err != nil {
			return nil, fmt.Errorf("truncated: %v", err)
		}
		if kind == recEnd {
			return recs, nil
		}
		var hdr struct{ Type, N uint32 }
		if err := binary.Read(r, binary.LittleEndian, &hdr); err != nil {
			return nil, err
		}
		rec := goldenRecord{kind: int(kind), typ: Type(hdr.Type), n: int(hdr.N)}
		switch kind {
		case recDequant, recActQ, recRefQ, recVecDot:
			if rec.a, err = blob(); err != nil {
				return nil, err
			}
			if rec.b, err = blob(); err != nil {
				return nil, err
			}
			if kind == recVecDot {
				var res [2]float32
				if err := binary.Read(r, binary.LittleEndian, &res); err != nil {
					return nil, err
				}
				rec.generic, rec.simd = res[0], res[1]
			}
		case recHash:
			if err := binary.Read(r, binary.LittleEndian, &rec.hash); err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("unknown record kind %d", kind)
		}
		recs = append(recs, rec)
	}
}

func bytesToF32(b []byte) []float32 {
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

func records(t *testing.T, kind int) []goldenRecord {
	var out []goldenRecord
	for _, r := range loadGolden(t) {
		if r.kind == kind {
			out = append(out, r)
		}
	}
	if len(out) == 0 {
		t.Fatalf("no golden records of kind %d", kind)
	}
	return out
}

func TestGoldenDequantize(t *testing.T) {
	seen := map[Type]bool{}
	for _, r := range records(t, recDequant) {
		seen[r.typ] = true
		want := bytesToF32(r.b)
		if nb, err := r.typ.RowBytes(r.n); err != nil || nb != len(r.a) || len(want) != r.n {
			t.Fatalf("%v: fixture sizes disagree with RowBytes: %d bytes for %d elements (%v)", r.typ, len(r.a), r.n, err)
		}
		got := make([]float32, r.n)
		DequantizeRow(r.typ, r.a, got)
		bad := 0
		for i := range got {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				if bad < 5 {
					t.Errorf("%v[%d]: got %g (%#08x), ggml %g (%#08x)", r.typ, i, got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
				}
				bad++
			}
		}
		if bad > 0 {
			t.Errorf("%v: %d of %d values differ", r.typ, bad, r.n)
		}
	}
	for _, typ := range []Type{F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K} {
		if !seen[typ] {
			t.Errorf("no dequant fixture for %v", typ)
		}
	}
}

func TestGoldenActivationQuantize(t *testing.T) {
	for _, r := range records(t, recActQ) {
		src := bytesToF32(r.a)
		got := make([]byte, len(r.b))
		QuantizeRow(r.typ, src, got)
		if !bytes.Equal(got, r.b) {
			bb, _ := r.typ.RowBytes(r.typ.BlockSize())
			for i := range got {
				if got[i] != r.b[i] {
					blk := i / bb
					t.Errorf("%v n=%d: first difference at byte %d (block %d, offset %d): got %#02x, ggml %#02x",
						r.typ, r.n, i, blk, i%bb, got[i], r.b[i])
					break
				}
			}
		}
	}
}

// TestGoldenRefQuantize compares our weight quantizers with ggml's reference ones: bytes must
// match where we use the same algorithm, and elsewhere our error may not be much worse.
func TestGoldenRefQuantize(t *testing.T) {
	sameAlgorithm := map[Type]bool{Q4_0: true, Q4_1: true, Q5_0: true, Q5_1: true, IQ4_NL: true, MXFP4: true}
	// Our simple K-quant scale choice against ggml's searched one: allowed RMS error ratio.
	maxRatio := map[Type]float64{Q2_K: 1.6, Q3_K: 1.6, Q4_K: 1.6, Q5_K: 1.6, Q6_K: 1.3, Q8_0: 1.01, Q8_1: 1.01, Q8_K: 1.01}
	for _, r := range records(t, recRefQ) {
		src := bytesToF32(r.a)
		got := make([]byte, len(r.b))
		QuantizeRow(r.typ, src, got)
		if sameAlgorithm[r.typ] {
			if !bytes.Equal(got, r.b) {
				t.Errorf("%v: bytes differ from quantize_row_%s_ref", r.typ, r.typ)
			}
			continue
		}
		if r.typ == Q8_1 {
			continue // no dequantizer in ggml; Q8_0's comparison covers the quants
		}
		ours := rmsError(t, r.typ, src, got)
		theirs := rmsError(t, r.typ, src, r.b)
		ratio := ours / theirs
		t.Logf("%v: rms error ours %.5f, ggml ref %.5f (ratio %.3f)", r.typ, ours, theirs, ratio)
		if ratio > maxRatio[r.typ] {
			t.Errorf("%v: rms error %.5f is %.2fx ggml's %.5f (limit %.2fx)", r.typ, ours, ratio, theirs, maxRatio[r.typ])
		}
	}
}

func rmsError(t *testing.T, typ Type, src []float32, q []byte) float64 {
	t.Helper()
	back := make([]float32, len(src))
	DequantizeRow(typ, q, back)
	var se float64
	for i := range src {
		d := float64(src[i]) - float64(back[i])
		se += d * d
	}
	return math.Sqrt(se / float64(len(src)))
}

func TestGoldenVecDot(t *testing.T) {
	seen := map[Type]int{}
	for _, r := range records(t, recVecDot) {
		seen[r.typ]++
		got := VecDot(r.typ, r.n, r.a, r.b)
		if math.Float32bits(got) != math.Float32bits(r.generic) {
			t.Errorf("%v n=%d: got %.9g, ggml generic kernel %.9g", r.typ, r.n, got, r.generic)
		}
		// The AVX2 kernels add in another order (and with FMA): compare relative to the sum of
		// magnitudes, which is what bounds a reordering's rounding error.
		scale := absDot(r.typ, r.n, r.a, r.b)
		if diff := math.Abs(float64(got) - float64(r.simd)); diff > 2e-6*scale+1e-30 {
			t.Errorf("%v n=%d: got %.9g, ggml AVX2 kernel %.9g: |diff| %.3g > 2e-6 * %.3g", r.typ, r.n, got, r.simd, diff, scale)
		}
	}
	for _, typ := range []Type{F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K} {
		if seen[typ] == 0 {
			t.Errorf("no vec_dot fixture for %v", typ)
		}
	}
}

// absDot is sum |w_i * x_i| over the dequantized rows, in float64.
func absDot(typ Type, n int, w, x []byte) float64 {
	wf := make([]float32, n)
	xf := make([]float32, n)
	DequantizeRow(typ, w, wf)
	DequantizeRow(typ.DotType(), x, xf)
	var s float64
	for i := range wf {
		s += math.Abs(float64(wf[i]) * float64(xf[i]))
	}
	return s
}

// convSweep yields the float32 bit patterns of quantref's conversion sweep: for every half,
// its exact float32 image, the exact midpoint above it and one ulp either side of that
// midpoint, then 1<<20 patterns from splitmix64 seeded with 42.
func convSweep(yield func(uint32)) {
	for h := 0; h < 1<<16; h++ {
		b := math.Float32bits(fp16ToFP32Slow(uint16(h)))
		yield(b)
		yield(b + 0x1000)
		yield(b + 0x0fff)
		yield(b + 0x1001)
	}
	s := uint64(42)
	for i := 0; i < 1<<20; i++ {
		s += 0x9E3779B97F4A7C15
		z := s
		z = (z ^ z>>30) * 0xBF58476D1CE4E5B9
		z = (z ^ z>>27) * 0x94D049BB133111EB
		z ^= z >> 31
		yield(uint32(z >> 32))
	}
}

type fnv64 uint64

func newFNV() fnv64 { return 0xcbf29ce484222325 }

func (h *fnv64) add(b ...byte) {
	for _, c := range b {
		*h = (*h ^ fnv64(c)) * 0x100000001b3
	}
}

func TestGoldenConversions(t *testing.T) {
	want := map[Type]uint64{}
	for _, r := range records(t, recHash) {
		want[r.typ] = r.hash
	}
	h := newFNV()
	for i := 0; i < 1<<16; i++ {
		b := math.Float32bits(FP16ToFP32(uint16(i)))
		h.add(byte(b), byte(b>>8), byte(b>>16), byte(b>>24))
	}
	if uint64(h) != want[hashF16ToF32F16C] {
		t.Errorf("FP16ToFP32 differs from F16C on some half")
	}
	if uint64(h) != want[hashF16ToF32Compute] {
		t.Errorf("FP16ToFP32 differs from ggml_compute_fp16_to_fp32 on some half")
	}
	h16, hcanon, hbf := newFNV(), newFNV(), newFNV()
	convSweep(func(bits uint32) {
		f := math.Float32frombits(bits)
		a := FP32ToFP16(f)
		c := fp16Canonical(f)
		b := FP32ToBF16(f)
		h16.add(byte(a), byte(a>>8))
		hcanon.add(byte(c), byte(c>>8))
		hbf.add(byte(b), byte(b>>8))
	})
	if uint64(h16) != want[hashF32ToF16F16C] {
		t.Errorf("FP32ToFP16 differs from F16C's VCVTPS2PH on the sweep")
	}
	if uint64(hcanon) != want[hashF32ToF16Compute] {
		t.Errorf("fp16Canonical differs from ggml_compute_fp32_to_fp16 on the sweep")
	}
	if uint64(hbf) != want[hashF32ToBF16] {
		t.Errorf("FP32ToBF16 differs from ggml_compute_fp32_to_bf16 on the sweep")
	}
}

// mxfp4Sweep yields quantref's MXFP4 scale sweep (write_mxfp4_scale_hash): the largest
// magnitudes whose E8M0 exponent depends on how log2f rounds, those within 256 patterns below
// a power of two. For every normal binade the 256 patterns just below its top and its 16
// lowest; for every power of two among the subnormals the 256 patterns below it and the power
// itself; then +Inf, 0, the largest finite float32 and 1<<16 patterns from splitmix64 seeded
// with 7.
func mxfp4Sweep(yield func(uint32)) {
	for binade := uint32(1); binade < 255; binade++ {
		for k := uint32(0); k < 256; k++ {
			yield(binade<<23 | (0x7fffff - k))
		}
		for k := uint32(0); k < 16; k++ {
			yield(binade<<23 | k)
		}
	}
	for p := uint32(0); p < 24; p++ {
		for k := uint32(1); k <= 256 && k < 1<<p; k++ {
			yield(1<<p - k)
		}
		yield(1 << p)
	}
	yield(0x7f800000)
	yield(0)
	yield(0x7f7fffff)
	s := uint64(7)
	for i := 0; i < 1<<16; i++ {
		s += 0x9E3779B97F4A7C15
		z := s
		z = (z ^ z>>30) * 0xBF58476D1CE4E5B9
		z = (z ^ z>>27) * 0x94D049BB133111EB
		z ^= z >> 31
		yield(uint32(z >> 32))
	}
}

// TestGoldenMXFP4Scales holds QuantizeRow(MXFP4) to quantize_row_mxfp4_ref on every float32
// whose E8M0 exponent depends on how log2f rounds (the patterns just below each power of two,
// subnormals included), on infinity, zero and random patterns: each is the largest magnitude
// of a block whose other values are fixed fractions of it, so the hash covers the exponent and
// the codebook indices.
func TestGoldenMXFP4Scales(t *testing.T) {
	var want uint64
	found := false
	for _, r := range records(t, recHash) {
		if r.typ == hashMXFP4RefQ {
			want, found = r.hash, true
		}
	}
	if !found {
		t.Fatal("no MXFP4 scale sweep in the fixtures")
	}
	h := newFNV()
	var x [32]float32
	var b [17]byte
	mxfp4Sweep(func(bits uint32) {
		v := math.Float32frombits(bits)
		x[0] = v
		for j := 1; j < 32; j++ {
			x[j] = v * (float32(j-16) / 16)
		}
		QuantizeRow(MXFP4, x[:], b[:])
		h.add(b[:]...)
	})
	if uint64(h) != want {
		t.Errorf("QuantizeRow(MXFP4) differs from quantize_row_mxfp4_ref on the scale sweep")
	}
}
