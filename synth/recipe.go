package synth

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/commit-run/commit-run/quant"
)

// Recipe assigns a ggml type to every weight, the way a llama.cpp quantization preset does.
// One-dimensional tensors (norms, biases, the shared-expert gate vector) and the routers
// (ffn_gate_inp) always stay F32, as llama.cpp's quantizer leaves them.
type Recipe struct {
	Name     string     // short name used in model names, e.g. "q4km"
	FileType uint32     // general.file_type (llama_ftype), for tools that display it
	Base     quant.Type // type of every quantizable weight without a rule
	// Rules override Base by role: the tensor name without "blk.N." and ".weight" (e.g.
	// "attn_v", "ffn_down_exps", "output", "token_embd"); "role@N" applies to layer N only and
	// wins over "role".
	Rules map[string]quant.Type
	// mix, when set, picks each weight's type from its place in the model, as a llama.cpp
	// preset does, in place of Base and Rules.
	mix func(slot) quant.Type
}

// slot is where a weight sits in its model: what llama.cpp's presets choose a type by
// (llama_tensor_get_type).
type slot struct {
	role    string // as Rules names it
	layer   int    // -1 outside the layers
	layers  int    // the model's layers, the next-token-prediction block included (n_layer_all)
	experts int
	tied    bool // no output matrix: the token embedding is the output's too
	// The weight's index among the model's attention-value-like weights (valueLike), in file
	// order, and their number.
	wv, nwv int
}

// valueLike reports whether llama.cpp's presets treat a role as they treat attn_v (its
// category_is_attn_v): the value projection, alone or in a fused q/k/v or MLA's kv_b.
func valueLike(role string) bool {
	return role == "attn_v" || role == "attn_qkv" || role == "attn_kv_b"
}

// moreBits is llama.cpp's use_more_bits: the first and last eighth of n layers and every
// third between, about half of them.
func moreBits(i, n int) bool { return i < n/8 || i >= 7*n/8 || (i-n/8)%3 == 2 }

// llamaQ4KM is llama.cpp's Q4_K_M preset (llama_tensor_get_type for every architecture but
// Falcon): Q4_K; Q6_K for the output (and the token embedding where it is the output too),
// for the attention values of moreBits's share of them and for every FFN down projection
// (dense, routed and shared) of moreBits's layers; in a model of exactly 8 experts, Q8_0
// keys and values and Q5_K attention outputs.
func llamaQ4KM(w slot) quant.Type {
	switch {
	case w.role == "output" || w.role == "token_embd" && w.tied:
		return quant.Q6_K
	case valueLike(w.role) && w.experts == 8, w.role == "attn_k" && w.experts == 8:
		return quant.Q8_0
	case valueLike(w.role) && moreBits(w.wv, w.nwv):
		return quant.Q6_K
	case w.role == "attn_output" && w.experts == 8:
		return quant.Q5_K
	case strings.Contains(w.role, "ffn_down") && w.layer >= 0 && moreBits(w.layer, w.layers):
		return quant.Q6_K
	}
	return quant.Q4_K
}

// llama_ftype values for general.file_type.
const (
	ftypeF32    = 0
	ftypeF16    = 1
	ftypeQ4_0   = 2
	ftypeQ4_1   = 3
	ftypeQ8_0   = 7
	ftypeQ5_0   = 8
	ftypeQ5_1   = 9
	ftypeQ2_K   = 10
	ftypeQ3_K_M = 12
	ftypeQ4_K_M = 15
	ftypeQ5_K_M = 17
	ftypeQ6_K   = 18
	ftypeIQ4_NL = 25
	ftypeBF16   = 32
)

// Standard recipes. Q4KM is llama.cpp's Q4_K_M preset, rule for rule; the other K-quant
// mixes follow the shape of llama.cpp's presets (more bits for attn_v, ffn_down and the
// output, attn_k/attn_v at Q8_0 for 8-expert models) without reproducing every rule: what
// matters is that real files' combinations of types occur.
var (
	F32  = Recipe{Name: "f32", FileType: ftypeF32, Base: quant.F32}
	F16  = Recipe{Name: "f16", FileType: ftypeF16, Base: quant.F16}
	BF16 = Recipe{Name: "bf16", FileType: ftypeBF16, Base: quant.BF16}
	Q8_0 = Recipe{Name: "q8_0", FileType: ftypeQ8_0, Base: quant.Q8_0}
	// Q4KM is llama.cpp's Q4_K_M (llamaQ4KM): the public shapes' "q4km", so that their bytes
	// are the published files'.
	Q4KM = Recipe{Name: "q4km", FileType: ftypeQ4_K_M, Base: quant.Q4_K, mix: llamaQ4KM}
	// q4kmGolden is the Q4_K_M-like mix the golden fixtures of that name were made from,
	// before Q4KM followed llama.cpp rule for rule: it puts Q5_K and Q6_K beside Q4_K in
	// every model it is given.
	q4kmGolden = Recipe{Name: "q4km", FileType: ftypeQ4_K_M, Base: quant.Q4_K, Rules: map[string]quant.Type{
		"attn_v": quant.Q6_K, "ffn_down": quant.Q6_K, "ffn_down_exps@0": quant.Q6_K,
		"ffn_down_shexp": quant.Q6_K, "attn_kv_b": quant.Q6_K, "attn_v_b": quant.Q6_K,
		"output": quant.Q6_K, "attn_output": quant.Q5_K,
	}}
	// q4km8Golden is q4kmGolden for the golden 8-expert model, where llama.cpp keeps
	// attn_k/attn_v at Q8_0.
	q4km8Golden = Recipe{Name: "q4km", FileType: ftypeQ4_K_M, Base: quant.Q4_K, Rules: map[string]quant.Type{
		"attn_k": quant.Q8_0, "attn_v": quant.Q8_0, "attn_output": quant.Q5_K,
		"ffn_down_exps@0": quant.Q6_K, "output": quant.Q6_K,
	}}
	// Q5KM is a Q5_K_M-like mix.
	Q5KM = Recipe{Name: "q5km", FileType: ftypeQ5_K_M, Base: quant.Q5_K, Rules: map[string]quant.Type{
		"attn_v": quant.Q6_K, "ffn_down_exps": quant.Q6_K, "ffn_down": quant.Q6_K, "output": quant.Q6_K,
	}}
	// Q3KM is a Q3_K_M-like mix.
	Q3KM = Recipe{Name: "q3km", FileType: ftypeQ3_K_M, Base: quant.Q3_K, Rules: map[string]quant.Type{
		"attn_v": quant.Q5_K, "attn_output": quant.Q4_K, "ffn_down": quant.Q4_K, "ffn_down_exps": quant.Q4_K,
		"output": quant.Q6_K,
	}}
	// Q2K is a Q2_K-like mix.
	Q2K = Recipe{Name: "q2k", FileType: ftypeQ2_K, Base: quant.Q2_K, Rules: map[string]quant.Type{
		"attn_v": quant.Q4_K, "attn_output": quant.Q3_K, "ffn_down_exps": quant.Q3_K, "ffn_down": quant.Q3_K,
		"output": quant.Q6_K,
	}}
	// Q4_0M mixes the legacy 32-element types: Q4_0 with Q4_1 on some roles and Q6_K output.
	Q4_0M = Recipe{Name: "q4_0", FileType: ftypeQ4_0, Base: quant.Q4_0, Rules: map[string]quant.Type{
		"attn_v": quant.Q4_1, "ffn_down_exps": quant.Q4_1, "ffn_down": quant.Q4_1, "ffn_down_shexp": quant.Q4_1,
		"output": quant.Q6_K,
	}}
	// Q4_0Preset is what llama.cpp's Q4_0 preset writes: Q4_0 throughout, Q6_K output. The
	// benchmark uses it; the golden Q4_0M mix exists to cover Q4_1 as well.
	Q4_0Preset = Recipe{Name: "q4_0-preset", FileType: ftypeQ4_0, Base: quant.Q4_0, Rules: map[string]quant.Type{
		"output": quant.Q6_K,
	}}
	// Q5_1M mixes Q5_1 and Q5_0.
	Q5_1M = Recipe{Name: "q5_1", FileType: ftypeQ5_1, Base: quant.Q5_1, Rules: map[string]quant.Type{
		"attn_q": quant.Q5_0, "attn_k": quant.Q5_0, "ffn_gate_exps": quant.Q5_0, "ffn_gate": quant.Q5_0,
		"output": quant.Q8_0,
	}}
	// IQ4NL is IQ4_NL throughout with a Q6_K output, as llama.cpp's IQ4_NL preset.
	IQ4NL = Recipe{Name: "iq4_nl", FileType: ftypeIQ4_NL, Base: quant.IQ4_NL, Rules: map[string]quant.Type{
		"output": quant.Q6_K,
	}}
)

func (r Recipe) validate() error {
	check := func(t quant.Type, what string) error {
		if !t.Weight() {
			return fmt.Errorf("recipe %q: %s has type %v, which is not a weight type", r.Name, what, t)
		}
		return nil
	}
	if r.Name == "" {
		return fmt.Errorf("recipe without a name")
	}
	if err := check(r.Base, "base"); err != nil {
		return err
	}
	for role, t := range r.Rules {
		if err := check(t, role); err != nil {
			return err
		}
	}
	return nil
}

// typeOf returns the type of a quantizable weight at w whose rows have ne0 elements. A
// K-quant that does not divide the row falls back as llama.cpp's quantizer does (Q4_K->Q5_0,
// Q5_K->Q5_1, Q6_K->Q8_0, Q2_K/Q3_K->IQ4_NL, the rule of the llama.cpp releases most published
// files were made with), and a row that no block type divides is stored as F16.
func (r Recipe) typeOf(w slot, ne0 int) quant.Type {
	t := r.Base
	if rt, ok := r.Rules[w.role]; ok {
		t = rt
	}
	if w.layer >= 0 {
		if rt, ok := r.Rules[w.role+"@"+strconv.Itoa(w.layer)]; ok {
			t = rt
		}
	}
	if r.mix != nil {
		t = r.mix(w)
	}
	if ne0%t.BlockSize() != 0 {
		switch t {
		case quant.Q4_K:
			t = quant.Q5_0
		case quant.Q5_K:
			t = quant.Q5_1
		case quant.Q6_K:
			t = quant.Q8_0
		case quant.Q2_K, quant.Q3_K:
			t = quant.IQ4_NL
		}
		if ne0%t.BlockSize() != 0 {
			t = quant.F16
		}
	}
	return t
}

// String names the recipe.
func (r Recipe) String() string { return r.Name }

// RecipeByName returns a standard recipe by name, or else a uniform one named after a ggml
// type ("q6_k", "q4_1", ...): every quantizable weight of that type, with llama.cpp's
// fallbacks where rows do not divide into its blocks.
func RecipeByName(name string) (Recipe, error) {
	name = strings.ToLower(name)
	for _, r := range []Recipe{F32, F16, BF16, Q8_0, Q4KM, Q5KM, Q3KM, Q2K, Q4_0M, Q4_0Preset, Q5_1M, IQ4NL, MXFP4MoE} {
		if r.Name == name {
			return r, nil
		}
	}
	// general.file_type of a file that is mostly of one type (the _S variant for K-quants).
	ftype := map[quant.Type]uint32{quant.F32: ftypeF32, quant.F16: ftypeF16, quant.BF16: ftypeBF16,
		quant.Q4_0: ftypeQ4_0, quant.Q4_1: ftypeQ4_1, quant.Q5_0: ftypeQ5_0, quant.Q5_1: ftypeQ5_1,
		quant.Q8_0: ftypeQ8_0, quant.Q2_K: ftypeQ2_K, quant.Q3_K: 11, quant.Q4_K: 14, quant.Q5_K: 16,
		quant.Q6_K: ftypeQ6_K, quant.IQ4_NL: ftypeIQ4_NL}
	for t := quant.Type(0); t <= quant.BF16; t++ {
		if t.Weight() && strings.ToLower(t.String()) == name {
			return Recipe{Name: name, FileType: ftype[t], Base: t}, nil
		}
	}
	return Recipe{}, fmt.Errorf("unknown type recipe %q", name)
}
