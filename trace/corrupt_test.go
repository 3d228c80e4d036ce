package trace

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// corpusFile is a small trace of three chunks (3, 2 and 2 tokens) with every kind of
// field present.
func corpusFile(t testing.TB) (Header, []*Token, []byte) {
	h := smallHeader(InputsF16, true)
	toks := genTokens(rand.New(rand.NewPCG(31, 32)), h, 7)
	return h, toks, writeTrace(t, h, toks, 2, 4)
}

// TestTruncated cuts the file at every byte. Every cut must end in ErrTruncated after
// exactly the tokens of the chunks that lie wholly before the cut, including cuts on a
// chunk boundary, where only the missing end frame tells the file is incomplete.
func TestTruncated(t *testing.T) {
	h, toks, data := corpusFile(t)
	ends, counts := frameEnds(data)
	if len(ends) != 5 || counts[1] != 3 || counts[2] != 2 || counts[3] != 2 {
		t.Fatalf("frames end at %v holding %v tokens; want three chunks of 3, 2, 2", ends, counts)
	}
	for cut := range len(data) {
		_, read, err := readAll(data[:cut])
		if !errors.Is(err, ErrTruncated) || !errors.Is(err, ErrCorrupt) {
			t.Fatalf("cut at %d of %d: %v, want ErrTruncated", cut, len(data), err)
		}
		want := 0
		for i, end := range ends {
			if end <= cut {
				want += counts[i]
			}
		}
		if len(read) != want {
			t.Fatalf("cut at %d: %d tokens before the error, want %d", cut, len(read), want)
		}
		for i := range read {
			if err := sameToken(read[i], toks[i], h.Inputs); err != nil {
				t.Fatalf("cut at %d, token %d: %v", cut, i, err)
			}
		}
	}
	// The messages say where: a cut on a boundary, and one inside a chunk's payload.
	_, _, err := readAll(data[:ends[2]])
	if want := "trace: no end frame after chunk 2 (byte "; err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("cut at a boundary: %v; want it to start %q", err, want)
	}
	_, _, err = readAll(data[:ends[2]+frameSize+3])
	if want := "trace: chunk 2 at byte " + strconv.Itoa(ends[2]) + ": payload: 3 of "; err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("cut inside a payload: %v; want it to start %q", err, want)
	}
	if _, read, err := readAll(data); err != io.EOF || len(read) != len(toks) {
		t.Fatalf("whole file: %d tokens, %v", len(read), err)
	}
}

// TestFlipped flips bits in every byte. The checksums must catch each one: no flip may
// read as a complete trace.
func TestFlipped(t *testing.T) {
	_, _, data := corpusFile(t)
	for i := range data {
		for _, mask := range []byte{0x01, 0x80, 0xff} {
			bad := bytes.Clone(data)
			bad[i] ^= mask
			_, _, err := readAll(bad)
			if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrNotTrace) && !errors.Is(err, ErrVersion) {
				t.Fatalf("byte %d ^ %#x: %v; want ErrCorrupt, ErrNotTrace or ErrVersion", i, mask, err)
			}
		}
	}
}

func TestCorruptMessages(t *testing.T) {
	_, _, data := corpusFile(t)
	ends, _ := frameEnds(data)
	cases := []struct {
		name string
		edit func(b []byte) []byte
		is   error
		want string
	}{
		{"magic", func(b []byte) []byte { b[0] = 'X'; return b }, ErrNotTrace, "bad magic"},
		{"version", func(b []byte) []byte { b[8] = 2; return b }, ErrVersion, "version 2"},
		{"header length", func(b []byte) []byte { binary.LittleEndian.PutUint32(b[12:], 1<<30); return b }, ErrCorrupt, "header JSON length 1073741824"},
		{"header checksum", func(b []byte) []byte { b[20] ^= 1; return b }, ErrCorrupt, "header checksum"},
		{"chunk checksum", func(b []byte) []byte { b[ends[1]+frameSize+5] ^= 1; return b }, ErrCorrupt, "chunk 1 at byte " + strconv.Itoa(ends[1]) + ": checksum"},
		{"chunk count", func(b []byte) []byte { b[ends[0]+4] = 9; return b }, ErrCorrupt, "chunk 0 at byte " + strconv.Itoa(ends[0]) + ": 9 tokens in"},
		{"frame tag", func(b []byte) []byte { b[ends[2]] = 'X'; return b }, ErrCorrupt, `chunk 2 at byte ` + strconv.Itoa(ends[2]) + `: unknown frame tag "XOKS"`},
		{"trailing bytes", func(b []byte) []byte { return append(b, 0) }, ErrCorrupt, "bytes after the end frame"},
		{"end counts", func(b []byte) []byte {
			f := b[ends[3]:]
			binary.LittleEndian.PutUint64(f[frameSize:], 6)
			binary.LittleEndian.PutUint32(f[12:], crc32.Update(crc32.Checksum(f[:12], castagnoli), castagnoli, f[frameSize:]))
			return b
		}, ErrCorrupt, "end frame counts 6 tokens in 3 chunks, read 7 in 3"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := readAll(c.edit(bytes.Clone(data)))
			if !errors.Is(err, c.is) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("%v; want %v containing %q", err, c.is, c.want)
			}
		})
	}
}

// preamble is a version-1 preamble around the header JSON js, checksum included.
func preamble(js string) []byte {
	b := []byte(magic + "\x01\x00\x00\x00")
	b = binary.LittleEndian.AppendUint32(b, uint32(len(js)))
	b = append(b, js...)
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum([]byte(js), castagnoli))
}

// TestForeignHeader: a header whose checksum is right but whose content is not.
func TestForeignHeader(t *testing.T) {
	for _, c := range []struct{ js, want string }{
		{`not json`, "header JSON: invalid character"},
		{`{"layers": "many"}`, "header JSON: json: cannot unmarshal"},
		{`{"layers": 4, "moe_layers": [1, 3], "experts": 6, "used": 2}{}`, "header JSON: invalid character"},
		{`{"layers": 4, "moe_layers": [1, 3], "experts": 6, "used": 0}`, "header: used 0: want 1..experts (6)"},
		{`{"layers": 4, "moe_layers": [1, 3], "experts": 6, "used": 2, "inputs": "f8"}`, `header: inputs "f8"`},
	} {
		_, err := NewReader(bytes.NewReader(preamble(c.js)))
		if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("header %s: %v; want ErrCorrupt containing %q", c.js, err, c.want)
		}
	}
	// Unknown keys are ignored, and a header alone is an incomplete trace, not a bad one.
	js := `{"layers": 4, "moe_layers": [1, 3], "experts": 6, "used": 2, "future": [1]}`
	h, _, err := readAll(preamble(js))
	if !errors.Is(err, ErrTruncated) || h.Inputs != InputsNone || h.Used != 2 {
		t.Errorf("header with an unknown key: %+v, %v", h, err)
	}
}

// TestForeignWriter feeds the reader records with valid checksums but impossible values,
// as a buggy writer in another language could produce: the reader must refuse them with
// the token and layer named.
func TestForeignWriter(t *testing.T) {
	h, toks, data := corpusFile(t)
	ends, _ := frameEnds(data)
	lay, err := h.layout()
	if err != nil {
		t.Fatal(err)
	}
	rec := func(b []byte, tok int) []byte { return b[ends[0]+frameSize+tok*lay.tokenSize:] }
	layer := func(b []byte, tok, j int) []byte { return rec(b, tok)[16+j*lay.layerBytes:] }
	inputOff := 6*h.Used + 4*h.Experts
	cases := []struct {
		name string
		edit func(b []byte)
		want string
	}{
		{"flags", func(b []byte) { rec(b, 1)[13] = 2 }, "token 1: unknown flags 0x200"},
		{"expert range", func(b []byte) { binary.LittleEndian.PutUint16(layer(b, 2, 1)[2:], 6) }, "token 2: layer 3: expert 6 (rank 1) out of range"},
		{"duplicate", func(b []byte) { copy(layer(b, 0, 0)[2:4], layer(b, 0, 0)[:2]) }, "token 0: layer 1: expert"},
		{"NaN weight", func(b []byte) { binary.LittleEndian.PutUint32(layer(b, 1, 0)[4:], 0x7fc00000) }, "token 1: layer 1: weight[0] = NaN"},
		{"Inf logit", func(b []byte) { binary.LittleEndian.PutUint32(layer(b, 0, 1)[6*h.Used+4*3:], 0xff800000) }, "token 0: layer 3: logit[3] = -Inf"},
		{"NaN f16 input", func(b []byte) { binary.LittleEndian.PutUint16(layer(b, 2, 0)[inputOff+2*4:], 0x7e00) }, "token 2: layer 1: input[4]: f16 0x7e00 is not finite"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := bytes.Clone(data)
			c.edit(b)
			_, read, err := readAll(repairCRCs(b))
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "chunk 0 at byte "+strconv.Itoa(ends[0])) ||
				!strings.Contains(err.Error(), c.want) {
				t.Fatalf("%v; want ErrCorrupt naming chunk 0 and containing %q", err, c.want)
			}
			// Tokens before the bad one still come through.
			for i := range read {
				if err := sameToken(read[i], toks[i], h.Inputs); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestBoundedAllocation feeds lengths that promise far more data than follows: the
// reader must not allocate for data that never arrives.
func TestBoundedAllocation(t *testing.T) {
	// The largest record a header may declare: 15 layers of 2^20 f32 inputs, about 63 MB.
	h := Header{Layers: 15, MoELayers: make([]int, 15), Experts: 8, Used: 2, Embd: maxEmbd, Inputs: InputsF32}
	for i := range h.MoELayers {
		h.MoELayers[i] = i
	}
	var buf bytes.Buffer
	if _, err := NewWriter(&buf, h); err != nil {
		t.Fatal(err)
	}
	lay, _ := h.layout()
	frame := make([]byte, frameSize+100)
	copy(frame, "TOKS")
	binary.LittleEndian.PutUint32(frame[4:], 1)
	binary.LittleEndian.PutUint32(frame[8:], uint32(lay.tokenSize))
	bigChunk := append(bytes.Clone(buf.Bytes()), frame...)

	hugeHeader := []byte(magic + "\x01\x00\x00\x00\x00\x00\x04\x00{}")
	for _, c := range []struct {
		name string
		data []byte
	}{{"chunk of 63 MB with 100 bytes", bigChunk}, {"header of 256 KiB with 2 bytes", hugeHeader}} {
		t.Run(c.name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, _, err := readAll(c.data)
			runtime.ReadMemStats(&after)
			if !errors.Is(err, ErrTruncated) {
				t.Fatalf("%v, want ErrTruncated", err)
			}
			if got := after.TotalAlloc - before.TotalAlloc; got > 3<<20 {
				t.Errorf("allocated %d bytes for a %d-byte file", got, len(c.data))
			}
		})
	}
}
