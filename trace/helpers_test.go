package trace

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/commit-run/commit-run/quant"
)

// smallHeader is a trace shape small enough that tests can look at every byte.
func smallHeader(inputs InputFormat, logits bool) Header {
	return Header{
		Model: "tiny", Arch: "mixtral", Layers: 4, MoELayers: []int{1, 3},
		Experts: 6, Used: 2, Embd: 5, Inputs: inputs, Logits: logits,
		Source: "unit test", Created: "2025-01-02T03:04:05Z",
		ModelSHA256: "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff",
	}
}

// qwen3Header is the routing shape of Qwen3-30B-A3B (DESIGN.md §7), the largest per-token
// record of the target models, with f16 inputs and logits: what the trainer records.
func qwen3Header() Header {
	moe := make([]int, 48)
	for i := range moe {
		moe[i] = i
	}
	return Header{Model: "qwen3-shape", Arch: "qwen3moe", Layers: 48, MoELayers: moe,
		Experts: 128, Used: 8, Embd: 2048, Inputs: InputsF16, Logits: true, Synthetic: true}
}

// genTokens draws n tokens that fit h. Inputs include values that f16 rounds (and
// subnormals, zeros of both signs), so f16 comparisons exercise the rounding.
func genTokens(rng *rand.Rand, h Header, n int) []*Token {
	toks := make([]*Token, n)
	for i := range toks {
		t := &Token{Seq: i / 7, Pos: i % 7, ID: int32(rng.IntN(50000)) - 1, Decode: i%7 >= 3}
		if i == 1 {
			// The extremes of the stored fields (a variable: int is 32 bits on some GOARCH).
			var top uint32 = math.MaxUint32
			t.Seq, t.Pos, t.ID = int(top), int(top), math.MinInt32
		}
		for _, l := range h.MoELayers {
			lr := LayerRoute{Layer: l}
			for _, e := range rng.Perm(h.Experts)[:h.Used] {
				lr.Experts = append(lr.Experts, e)
				lr.Weights = append(lr.Weights, rng.Float32())
			}
			if h.Logits {
				lr.Logits = make([]float32, h.Experts)
				for e := range lr.Logits {
					lr.Logits[e] = float32(rng.NormFloat64() * 3)
				}
			}
			if h.Inputs != InputsNone && h.Inputs != "" {
				lr.Input = make([]float32, h.Embd)
				for d := range lr.Input {
					lr.Input[d] = float32(rng.NormFloat64() * 2)
				}
				specials := []float32{float32(math.Copysign(0, -1)), 1e-7, -3e-41, 65504, 0.1}
				lr.Input[i%h.Embd] = specials[i%len(specials)]
			}
			t.Layers = append(t.Layers, lr)
		}
		toks[i] = t
	}
	return toks
}

// writeTrace writes toks, flushing after the token indices in flushAfter.
func writeTrace(t testing.TB, h Header, toks []*Token, flushAfter ...int) []byte {
	t.Helper()
	var buf bytes.Buffer
	w, err := NewWriter(&buf, h)
	if err != nil {
		t.Fatal(err)
	}
	for i, tok := range toks {
		if err := w.Write(tok); err != nil {
			t.Fatal(err)
		}
		for _, f := range flushAfter {
			if f == i {
				if err := w.Flush(); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// readAll reads a trace to its end and returns what it got and the error that ended it
// (io.EOF for a complete trace).
func readAll(data []byte) (Header, []*Token, error) {
	r, err := NewReader(bytes.NewReader(data))
	if err != nil {
		return Header{}, nil, err
	}
	var toks []*Token
	for {
		tok, err := r.Next()
		if err != nil {
			return r.Header(), toks, err
		}
		toks = append(toks, tok)
	}
}

// f16Round is what f16 storage does to a value.
func f16Round(v float32) float32 { return quant.FP16ToFP32(quant.FP32ToFP16(v)) }

// sameToken compares a decoded token with the one written, floats bit for bit (f16 inputs
// after the same rounding).
func sameToken(got, want *Token, inputs InputFormat) error {
	if got.Seq != want.Seq || got.Pos != want.Pos || got.ID != want.ID || got.Decode != want.Decode {
		return fmt.Errorf("token fields %d/%d/%d/%v, want %d/%d/%d/%v",
			got.Seq, got.Pos, got.ID, got.Decode, want.Seq, want.Pos, want.ID, want.Decode)
	}
	if len(got.Layers) != len(want.Layers) {
		return fmt.Errorf("%d layers, want %d", len(got.Layers), len(want.Layers))
	}
	for j := range got.Layers {
		g, w := &got.Layers[j], &want.Layers[j]
		if g.Layer != w.Layer {
			return fmt.Errorf("layer %d, want %d", g.Layer, w.Layer)
		}
		if fmt.Sprint(g.Experts) != fmt.Sprint(w.Experts) {
			return fmt.Errorf("layer %d: experts %v, want %v", w.Layer, g.Experts, w.Experts)
		}
		round := func(v float32) float32 { return v }
		if inputs == InputsF16 {
			round = f16Round
		}
		for _, c := range []struct {
			name      string
			got, want []float32
			round     func(float32) float32
		}{
			{"weights", g.Weights, w.Weights, nil},
			{"logits", g.Logits, w.Logits, nil},
			{"input", g.Input, w.Input, round},
		} {
			if (c.got == nil) != (c.want == nil) || len(c.got) != len(c.want) {
				return fmt.Errorf("layer %d: %s of len %d (nil %v), want %d (nil %v)",
					w.Layer, c.name, len(c.got), c.got == nil, len(c.want), c.want == nil)
			}
			for i := range c.got {
				want := c.want[i]
				if c.round != nil {
					want = c.round(want)
				}
				if math.Float32bits(c.got[i]) != math.Float32bits(want) {
					return fmt.Errorf("layer %d: %s[%d] = %v, want %v", w.Layer, c.name, i, c.got[i], want)
				}
			}
		}
	}
	return nil
}

// frameEnds returns the byte offset of the end of the preamble and of every frame, and the
// number of tokens in each frame, walking a well-formed file (or a damaged one as far as
// its lengths allow). It trusts the lengths and checks nothing else.
func frameEnds(data []byte) (ends []int, counts []int) {
	if len(data) < 16 {
		return nil, nil
	}
	off := 16 + int(binary.LittleEndian.Uint32(data[12:])) + 4
	if off > len(data) || off < 0 {
		return nil, nil
	}
	ends, counts = append(ends, off), append(counts, 0)
	for off+frameSize <= len(data) {
		n := int(binary.LittleEndian.Uint32(data[off+8:]))
		end := off + frameSize + n
		if end > len(data) || end < off {
			break
		}
		c := 0
		if string(data[off:off+4]) == "TOKS" {
			c = int(binary.LittleEndian.Uint32(data[off+4:]))
		}
		ends, counts = append(ends, end), append(counts, c)
		off = end
	}
	return ends, counts
}

// repairCRCs returns a copy of data with every checksum the structure lets it find made
// right, so that fuzzed bytes get past the checksums to the decoding behind them.
func repairCRCs(data []byte) []byte {
	data = bytes.Clone(data)
	ends, _ := frameEnds(data)
	if len(ends) == 0 {
		return data
	}
	le := binary.LittleEndian
	le.PutUint32(data[ends[0]-4:], crc32.Checksum(data[16:ends[0]-4], castagnoli))
	for i := 1; i < len(ends); i++ {
		f := data[ends[i-1]:ends[i]]
		le.PutUint32(f[12:], crc32.Update(crc32.Checksum(f[:12], castagnoli), castagnoli, f[frameSize:]))
	}
	return data
}

// countingReader counts the bytes a reader has taken from its source.
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// failWriter fails every write after the first ok bytes.
type failWriter struct{ ok int }

var errDiskFull = errors.New("disk full")

func (f *failWriter) Write(p []byte) (int, error) {
	if len(p) > f.ok {
		n := f.ok
		f.ok = 0
		return n, errDiskFull
	}
	f.ok -= len(p)
	return len(p), nil
}
