package trace

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	for _, inputs := range []InputFormat{InputsNone, InputsF16, InputsF32} {
		for _, logits := range []bool{false, true} {
			t.Run(fmt.Sprintf("inputs=%s/logits=%v", inputs, logits), func(t *testing.T) {
				h := smallHeader(inputs, logits)
				toks := genTokens(rand.New(rand.NewPCG(1, 2)), h, 11)
				data := writeTrace(t, h, toks, 3, 4) // chunks of 4, 1 and 6 tokens
				got, read, err := readAll(data)
				if err != io.EOF {
					t.Fatalf("read ended with %v, want io.EOF", err)
				}
				if !reflect.DeepEqual(got, h.normalized()) {
					t.Errorf("header %+v, want %+v", got, h)
				}
				if len(read) != len(toks) {
					t.Fatalf("%d tokens, want %d", len(read), len(toks))
				}
				for i := range toks {
					if err := sameToken(read[i], toks[i], inputs); err != nil {
						t.Fatalf("token %d: %v", i, err)
					}
				}
			})
		}
	}
}

// The f16 comparison above would pass if f16 storage were f32 in disguise; this pins that
// inputs really are rounded, and to nearest even.
func TestF16InputsRounded(t *testing.T) {
	h := smallHeader(InputsF16, false)
	toks := genTokens(rand.New(rand.NewPCG(3, 4)), h, 1)
	in := toks[0].Layers[0].Input
	// 1 + 2^-11 lies halfway between two halves; nearest even is 1. 1 + 3*2^-11 rounds up.
	in[0], in[1] = 1+1.0/2048, 1+3.0/2048
	_, read, err := readAll(writeTrace(t, h, toks))
	if err != io.EOF {
		t.Fatal(err)
	}
	if g := read[0].Layers[0].Input; g[0] != 1 || g[1] != 1+4.0/2048 {
		t.Errorf("inputs %v, %v after f16; want 1, %v", g[0], g[1], 1+4.0/2048)
	}
	if f32, f16 := len(writeTrace(t, smallHeader(InputsF32, false), toks)), len(writeTrace(t, h, toks)); f32-f16 != 2*h.Embd*len(h.MoELayers) {
		t.Errorf("f32 file %d bytes, f16 %d: want a difference of 2 bytes per input value", f32, f16)
	}
}

func TestEmptyTrace(t *testing.T) {
	h := smallHeader(InputsNone, false)
	got, read, err := readAll(writeTrace(t, h, nil))
	if err != io.EOF || len(read) != 0 || got.Model != h.Model {
		t.Fatalf("empty trace: %d tokens, %v, header %+v", len(read), err, got)
	}
}

// TestStreaming reads 3000 tokens over 12 chunks and checks, after every token, that the
// reader has taken no more from its source than the chunks decoded so far plus its read
// buffer, and keeps a single chunk in memory.
func TestStreaming(t *testing.T) {
	h := smallHeader(InputsF16, true)
	h.MoELayers, h.Layers, h.Embd = []int{0, 1, 2, 3}, 4, 64
	const n = 3000
	toks := genTokens(rand.New(rand.NewPCG(5, 6)), h, n)
	data := writeTrace(t, h, toks)
	ends, counts := frameEnds(data)
	if len(ends) != 1+12+1 || counts[1] != 256 || counts[12] != n-11*256 {
		t.Fatalf("frames end at %v holding %v tokens; want 12 chunks of 256 tokens and an end frame", ends, counts)
	}
	src := &countingReader{r: bytes.NewReader(data)}
	r, err := NewReader(src)
	if err != nil {
		t.Fatal(err)
	}
	chunkPayload := 256 * r.lay.tokenSize
	var tok Token
	for i := range n {
		if err := r.NextInto(&tok); err != nil {
			t.Fatalf("token %d: %v", i, err)
		}
		if err := sameToken(&tok, toks[i], h.Inputs); err != nil {
			t.Fatalf("token %d: %v", i, err)
		}
		if end := ends[1+i/256]; src.n > end+64<<10 {
			t.Fatalf("token %d of chunk ending at byte %d: reader took %d bytes", i, end, src.n)
		}
		if cap(r.buf) > chunkPayload {
			t.Fatalf("token %d: reader buffers %d bytes, a chunk is %d", i, cap(r.buf), chunkPayload)
		}
	}
	if err := r.NextInto(&tok); err != io.EOF {
		t.Fatalf("after the last token: %v, want io.EOF", err)
	}
	if err := r.NextInto(&tok); err != io.EOF {
		t.Fatalf("io.EOF is not sticky: %v", err)
	}
}

// TestLargeRecords writes tokens of the Qwen3-30B-A3B shape (about 220 KB each with f16
// inputs and logits), where a chunk holds a handful of tokens rather than 256.
func TestLargeRecords(t *testing.T) {
	h := qwen3Header()
	toks := genTokens(rand.New(rand.NewPCG(7, 8)), h, 13)
	data := writeTrace(t, h, toks)
	_, counts := frameEnds(data)
	if fmt.Sprint(counts) != "[0 4 4 4 1 0]" {
		t.Errorf("tokens per frame %v; want chunks of 4 (1 MiB / 223504-byte records)", counts)
	}
	_, read, err := readAll(data)
	if err != io.EOF || len(read) != len(toks) {
		t.Fatalf("%d tokens, %v", len(read), err)
	}
	for i := range toks {
		if err := sameToken(read[i], toks[i], h.Inputs); err != nil {
			t.Fatalf("token %d: %v", i, err)
		}
	}
}

func TestNextIntoReusesStorage(t *testing.T) {
	h := qwen3Header()
	toks := genTokens(rand.New(rand.NewPCG(9, 10)), h, 2)
	for len(toks) < 40 {
		toks = append(toks, toks[:2]...)
	}
	r, err := NewReader(bytes.NewReader(writeTrace(t, h, toks)))
	if err != nil {
		t.Fatal(err)
	}
	var tok Token
	if err := r.NextInto(&tok); err != nil {
		t.Fatal(err)
	}
	tok.Layers[5].Layer = -1 // a caller's scribble must not survive reuse
	allocs := testing.AllocsPerRun(30, func() {
		if err := r.NextInto(&tok); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("NextInto allocates %v times per token; want 0", allocs)
	}
	if tok.Layers[5].Layer != 5 {
		t.Errorf("reused token has layer %d, want 5", tok.Layers[5].Layer)
	}
	if err := sameToken(&tok, toks[31], h.Inputs); err != nil {
		t.Error(err)
	}
}

func TestCreateOpen(t *testing.T) {
	h := smallHeader(InputsF32, true)
	toks := genTokens(rand.New(rand.NewPCG(11, 12)), h, 5)
	path := filepath.Join(t.TempDir(), "a.crtrace")
	w, err := Create(path, h)
	if err != nil {
		t.Fatal(err)
	}
	if got := w.Header(); !reflect.DeepEqual(got, h) {
		t.Errorf("Writer.Header %+v, want %+v", got, h)
	}
	for _, tok := range toks {
		if err := w.Write(tok); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := w.Write(toks[0]); err == nil {
		t.Error("Write after Close succeeded")
	}
	r, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for i := range toks {
		tok, err := r.Next()
		if err != nil {
			t.Fatal(err)
		}
		if err := sameToken(tok, toks[i], h.Inputs); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := r.Next(); err != io.EOF {
		t.Fatalf("end: %v", err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}

	bad := h
	bad.Used = 0
	badPath := filepath.Join(t.TempDir(), "bad.crtrace")
	if _, err := Create(badPath, bad); err == nil {
		t.Fatal("Create with a bad header succeeded")
	}
	if _, err := Open(badPath); err == nil {
		t.Error("Create left a file behind after a bad header")
	}
	if _, err := Open(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("Open of a missing file succeeded")
	}
}

// TestWriteErrorSticky: once the stream breaks, the trace cannot go on (a later chunk
// would follow a partial one), and Close reports it rather than writing an end frame.
func TestWriteErrorSticky(t *testing.T) {
	h := smallHeader(InputsNone, false)
	toks := genTokens(rand.New(rand.NewPCG(13, 14)), h, 3)
	if _, err := NewWriter(&failWriter{ok: 10}, h); !errors.Is(err, errDiskFull) {
		t.Fatalf("NewWriter on a failing writer: %v", err)
	}
	ends, _ := frameEnds(writeTrace(t, h, nil))
	w, err := NewWriter(&failWriter{ok: ends[0] + 10}, h) // the preamble and a little
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Write(toks[0]); err != nil {
		t.Fatal(err)
	}
	if err := w.Flush(); !errors.Is(err, errDiskFull) {
		t.Fatalf("Flush: %v, want the disk-full error", err)
	}
	if err := w.Write(toks[1]); !errors.Is(err, errDiskFull) {
		t.Errorf("Write after a failed flush: %v", err)
	}
	if err := w.Close(); !errors.Is(err, errDiskFull) {
		t.Errorf("Close after a failed flush: %v", err)
	}
}
