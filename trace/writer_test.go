package trace

import (
	"bytes"
	"io"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
)

func TestWriteValidation(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	var beyond int64 = math.MaxUint32 + 1 // a variable: int is 32 bits on some GOARCH
	cases := []struct {
		name   string
		inputs InputFormat
		logits bool
		edit   func(tok *Token) *Token
		want   string // in the error, after "token 1 (seq 0, pos 1): "
	}{
		{"nil token", InputsNone, false, func(*Token) *Token { return nil }, "token 1: nil token"},
		{"negative seq", InputsNone, false, func(tok *Token) *Token { tok.Seq = -1; return tok }, "seq -1"},
		{"negative pos", InputsNone, false, func(tok *Token) *Token { tok.Pos = -2; return tok }, "pos -2"},
		{"pos beyond u32", InputsNone, false, func(tok *Token) *Token { tok.Pos = int(beyond); return tok }, "pos 4294967296"},
		{"missing layer", InputsNone, false, func(tok *Token) *Token { tok.Layers = tok.Layers[:1]; return tok }, "1 layers, want 2"},
		{"extra layer", InputsNone, false, func(tok *Token) *Token { tok.Layers = append(tok.Layers, tok.Layers[0]); return tok }, "3 layers, want 2"},
		{"layers swapped", InputsNone, false, func(tok *Token) *Token {
			tok.Layers[0], tok.Layers[1] = tok.Layers[1], tok.Layers[0]
			return tok
		}, "layer 3: out of order: want layer 1"},
		{"dense layer", InputsNone, false, func(tok *Token) *Token { tok.Layers[1].Layer = 2; return tok }, "layer 2: out of order: want layer 3"},
		{"too few experts", InputsNone, false, func(tok *Token) *Token { tok.Layers[1].Experts = tok.Layers[1].Experts[:1]; return tok }, "layer 3: 1 experts, want 2"},
		{"too many weights", InputsNone, false, func(tok *Token) *Token {
			tok.Layers[0].Weights = append(tok.Layers[0].Weights, 0.5)
			return tok
		}, "layer 1: 3 weights, want 2"},
		{"expert too big", InputsNone, false, func(tok *Token) *Token { tok.Layers[1].Experts[1] = 6; return tok }, "layer 3: expert 6 (rank 1) out of range 0..5"},
		{"negative expert", InputsNone, false, func(tok *Token) *Token { tok.Layers[0].Experts[0] = -1; return tok }, "layer 1: expert -1 (rank 0)"},
		{"duplicate expert", InputsNone, false, func(tok *Token) *Token {
			tok.Layers[1].Experts[0], tok.Layers[1].Experts[1] = 4, 4
			return tok
		}, "layer 3: expert 4 chosen twice"},
		{"NaN weight", InputsNone, false, func(tok *Token) *Token { tok.Layers[0].Weights[1] = nan; return tok }, "layer 1: weight[1] = NaN: not finite"},
		{"infinite weight", InputsNone, false, func(tok *Token) *Token { tok.Layers[1].Weights[0] = -inf; return tok }, "layer 3: weight[0] = -Inf"},
		{"logits missing", InputsNone, true, func(tok *Token) *Token { tok.Layers[1].Logits = nil; return tok }, "layer 3: 0 logits, want 6"},
		{"logits short", InputsNone, true, func(tok *Token) *Token { tok.Layers[0].Logits = tok.Layers[0].Logits[:5]; return tok }, "layer 1: 5 logits, want 6"},
		{"logits undeclared", InputsNone, false, func(tok *Token) *Token { tok.Layers[0].Logits = make([]float32, 6); return tok }, "layer 1: 6 logits, but the header stores none"},
		{"NaN logit", InputsNone, true, func(tok *Token) *Token { tok.Layers[1].Logits[4] = nan; return tok }, "layer 3: logit[4] = NaN"},
		{"input missing", InputsF32, false, func(tok *Token) *Token { tok.Layers[0].Input = nil; return tok }, "layer 1: input of 0 values, want 5"},
		{"input long", InputsF16, false, func(tok *Token) *Token { tok.Layers[1].Input = make([]float32, 6); return tok }, "layer 3: input of 6 values, want 5"},
		{"input undeclared", InputsNone, true, func(tok *Token) *Token { tok.Layers[1].Input = make([]float32, 5); return tok }, "layer 3: input of 5 values, but the header stores none"},
		{"infinite f32 input", InputsF32, false, func(tok *Token) *Token { tok.Layers[1].Input[2] = inf; return tok }, "layer 3: input[2] = +Inf: not finite"},
		{"NaN f16 input", InputsF16, false, func(tok *Token) *Token { tok.Layers[0].Input[3] = nan; return tok }, "layer 1: input[3] = NaN: not finite"},
		{"f16 overflow", InputsF16, false, func(tok *Token) *Token { tok.Layers[0].Input[4] = 65520; return tok }, "layer 1: input[4] = 65520: overflows f16"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := smallHeader(c.inputs, c.logits)
			toks := genTokens(rand.New(rand.NewPCG(21, 22)), h, 3)
			toks[1].Seq, toks[1].Pos = 0, 1
			var buf bytes.Buffer
			w, err := NewWriter(&buf, h)
			if err != nil {
				t.Fatal(err)
			}
			if err := w.Write(toks[0]); err != nil {
				t.Fatal(err)
			}
			bad := c.edit(toks[1])
			err = w.Write(bad)
			if err == nil {
				t.Fatal("Write accepted the token")
			}
			prefix := "trace: "
			if bad != nil {
				prefix = "trace: token 1 (seq " + strconv.Itoa(bad.Seq) + ", pos " + strconv.Itoa(bad.Pos) + "): "
			}
			if !strings.HasPrefix(err.Error(), prefix) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q; want it to start %q and contain %q", err, prefix, c.want)
			}
			// The rejected token leaves no trace, and the writer goes on.
			if err := w.Write(toks[2]); err != nil {
				t.Fatalf("Write after a rejected token: %v", err)
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			_, read, err := readAll(buf.Bytes())
			if err != io.EOF || len(read) != 2 {
				t.Fatalf("read back %d tokens, %v; want the 2 valid ones", len(read), err)
			}
			if err := sameToken(read[1], toks[2], h.Inputs); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestHeaderValidation(t *testing.T) {
	cases := []struct {
		name string
		edit func(h *Header)
		want string
	}{
		{"no layers", func(h *Header) { h.Layers = 0 }, "layers 0"},
		{"too many layers", func(h *Header) { h.Layers = maxLayers + 1 }, "layers 4097"},
		{"no MoE layers", func(h *Header) { h.MoELayers = nil }, "no MoE layers"},
		{"MoE layer beyond", func(h *Header) { h.MoELayers = []int{1, 4} }, "moe_layers[1] = 4: want 0..3"},
		{"MoE layer negative", func(h *Header) { h.MoELayers = []int{-1, 2} }, "moe_layers[0] = -1"},
		{"MoE layers unsorted", func(h *Header) { h.MoELayers = []int{3, 1} }, "moe_layers[1] = 1: not above"},
		{"MoE layers repeated", func(h *Header) { h.MoELayers = []int{1, 1} }, "moe_layers[1] = 1: not above"},
		{"no experts", func(h *Header) { h.Experts = 0 }, "experts 0"},
		{"experts beyond u16", func(h *Header) { h.Experts, h.Used = 65536, 1 }, "experts 65536: want 1..65535"},
		{"no used", func(h *Header) { h.Used = 0 }, "used 0"},
		{"used above experts", func(h *Header) { h.Used = 7 }, "used 7: want 1..experts (6)"},
		{"negative embd", func(h *Header) { h.Embd = -1 }, "embd -1"},
		{"inputs need embd", func(h *Header) { h.Embd = 0 }, "inputs f16 need embd >= 1"},
		{"unknown inputs", func(h *Header) { h.Inputs = "bf16" }, `inputs "bf16"`},
		{"bad sha", func(h *Header) { h.ModelSHA256 = "abc" }, `model_sha256 "abc"`},
		{"bad created", func(h *Header) { h.Created = "yesterday" }, `created "yesterday"`},
		{"record too big", func(h *Header) {
			h.Layers, h.MoELayers, h.Embd, h.Inputs = 17, make([]int, 17), maxEmbd, InputsF32
			for i := range h.MoELayers {
				h.MoELayers[i] = i
			}
		}, "exceeds 67108864"},
		{"header JSON too big", func(h *Header) { h.Source = strings.Repeat("x", maxHeaderJSON) }, "header JSON of"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := smallHeader(InputsF16, true)
			c.edit(&h)
			_, err := NewWriter(io.Discard, h)
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "trace: ") {
				t.Fatalf("NewWriter: %v; want an error containing %q", err, c.want)
			}
		})
	}
	// The limits themselves are allowed.
	h := smallHeader(InputsNone, false)
	h.Experts, h.Used, h.Embd, h.ModelSHA256, h.Created = maxExperts, maxExperts, 0, "", ""
	tok := &Token{}
	for _, l := range h.MoELayers {
		lr := LayerRoute{Layer: l, Experts: make([]int, maxExperts), Weights: make([]float32, maxExperts)}
		for e := range lr.Experts {
			lr.Experts[e] = maxExperts - 1 - e
		}
		tok.Layers = append(tok.Layers, lr)
	}
	_, read, err := readAll(writeTrace(t, h, []*Token{tok}))
	if err != io.EOF || len(read) != 1 || read[0].Layers[1].Experts[0] != 65534 {
		t.Fatalf("65535 experts, all used: %d tokens, %v", len(read), err)
	}
}

// A recorder that reuses buffers may hand empty, non-nil slices for what is not stored.
func TestWriteEmptyNotStored(t *testing.T) {
	h := smallHeader(InputsNone, false)
	toks := genTokens(rand.New(rand.NewPCG(23, 24)), h, 1)
	for j := range toks[0].Layers {
		toks[0].Layers[j].Logits, toks[0].Layers[j].Input = []float32{}, make([]float32, 0, 8)
	}
	_, read, err := readAll(writeTrace(t, h, toks))
	if err != io.EOF || len(read) != 1 || read[0].Layers[0].Logits != nil || read[0].Layers[0].Input != nil {
		t.Fatalf("%d tokens, %v", len(read), err)
	}
}
