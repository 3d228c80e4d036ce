package trace

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"runtime"
	"testing"
)

// FuzzReader reads arbitrary bytes, as given and with their checksums repaired (so that
// mutations reach the decoding behind the checksums). The reader must never panic, must
// allocate in proportion to the input, must end every file in io.EOF or a documented
// error, and whatever it accepts the writer must accept too and reproduce exactly.
func FuzzReader(f *testing.F) {
	for i, inputs := range []InputFormat{InputsNone, InputsF16, InputsF32} {
		h := smallHeader(inputs, i != 1)
		h.MoELayers, h.Experts, h.Used, h.Embd = []int{2}, 4, 2, 3
		toks := genTokens(rand.New(rand.NewPCG(41, uint64(i))), h, 3)
		data := writeTrace(f, h, toks, 0)
		f.Add(data)
		f.Add(data[:len(data)-5])
	}
	f.Add(writeTrace(f, smallHeader(InputsNone, false), nil))
	f.Add([]byte(magic))
	f.Fuzz(func(t *testing.T, data []byte) {
		fuzzOne(t, data)
		fuzzOne(t, repairCRCs(data))
	})
}

func fuzzOne(t *testing.T, data []byte) {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	h, toks, err := readAll(data)
	runtime.ReadMemStats(&after)
	// The reader's own buffers (64 KiB of bufio, at most one read step of 1 MiB ahead of the
	// data, the header JSON) plus decoded tokens, which grow at most 4x over their bytes
	// (u16 ids become ints, f16 inputs float32).
	if got, limit := after.TotalAlloc-before.TotalAlloc, uint64(3<<20+16*len(data)); got > limit {
		t.Fatalf("allocated %d bytes reading %d bytes (limit %d)", got, len(data), limit)
	}
	switch {
	case err == io.EOF:
	case errors.Is(err, ErrCorrupt), errors.Is(err, ErrNotTrace), errors.Is(err, ErrVersion):
		return
	default:
		t.Fatalf("undocumented error: %v", err)
	}
	var buf bytes.Buffer
	w, err := NewWriter(&buf, h)
	if err != nil {
		t.Fatalf("reader accepted a header the writer refuses: %v", err)
	}
	for i, tok := range toks {
		if err := w.Write(tok); err != nil {
			t.Fatalf("reader accepted token %d, the writer refuses it: %v", i, err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	_, again, err := readAll(buf.Bytes())
	if err != io.EOF || len(again) != len(toks) {
		t.Fatalf("rewritten trace: %d of %d tokens, %v", len(again), len(toks), err)
	}
	for i := range toks {
		// Inputs were read from this very format, so even f16 ones survive exactly.
		if err := sameToken(again[i], toks[i], InputsF32); err != nil {
			t.Fatalf("rewritten token %d: %v", i, err)
		}
	}
}
