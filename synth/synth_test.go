package synth

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ollama/ollama/fs/ggml"

	"github.com/commit-run/commit-run/quant"
	"github.com/commit-run/commit-run/tools/golden/fixture"
)

const fixtureDir = "../engine/testdata/golden"

// TestFixturesMatchGenerator regenerates every model a fixture was made from and compares
// hashes. A failure means the generator (or the quantizers it uses) changed: regenerate the
// fixtures with tools/golden/regen.sh, or the golden test compares against another model.
func TestFixturesMatchGenerator(t *testing.T) {
	fs, err := fixture.LoadDir(fixtureDir)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, f := range fs {
		if f.Model != "" {
			continue // a committed model file, checked by its hash in the engine's golden test
		}
		names[f.Name] = true
		s, err := GoldenSpec(f.Name)
		if err != nil {
			t.Errorf("fixture %s: %v", f.Name, err)
			continue
		}
		sum, err := WriteFile(s, filepath.Join(t.TempDir(), f.Name+".gguf"))
		if err != nil {
			t.Fatal(err)
		}
		if sum != f.SHA256 {
			t.Errorf("%s: generator writes sha256 %s, fixture was made from %s", f.Name, sum, f.SHA256)
		}
		prompts, err := Prompts(s, f.PromptCandidate+1)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(prompts[f.PromptCandidate], f.Prompt) {
			t.Errorf("%s: fixture prompt is not candidate %d", f.Name, f.PromptCandidate)
		}
	}
	for _, s := range Golden() {
		if !names[s.Name] {
			t.Errorf("golden model %s has no fixture", s.Name)
		}
	}
}

func TestDeterministic(t *testing.T) {
	s, err := GoldenSpec("deepseek2-mla-q4km")
	if err != nil {
		t.Fatal(err)
	}
	a, err := WriteFile(s, filepath.Join(t.TempDir(), "a.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := WriteFile(s, filepath.Join(t.TempDir(), "b.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	if a != b {
		t.Fatalf("two writes differ: %s %s", a, b)
	}
	s.Seed++
	c, err := WriteFile(s, filepath.Join(t.TempDir(), "c.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	if c == a {
		t.Fatal("seed does not change the model")
	}
}

// TestGoldenCoverage checks that every weight type the engine supports occurs in some golden
// model, and that routers, norms and biases stay F32 as in llama.cpp's quantizations.
func TestGoldenCoverage(t *testing.T) {
	seen := map[quant.Type]bool{}
	for _, s := range Golden() {
		m, err := Build(s)
		if err != nil {
			t.Fatal(err)
		}
		for _, tn := range m.Tensors {
			seen[tn.Type] = true
			if len(tn.Shape) == 1 || strings.HasSuffix(tn.Name, "ffn_gate_inp.weight") {
				if tn.Type != quant.F32 {
					t.Errorf("%s: %s is %v, want F32", s.Name, tn.Name, tn.Type)
				}
			}
		}
		if b := m.Bytes(); b > 20<<20 {
			t.Errorf("%s: %d bytes of tensors; keep golden models small", s.Name, b)
		}
	}
	for _, ty := range []quant.Type{quant.F32, quant.F16, quant.BF16, quant.Q8_0, quant.Q4_0, quant.Q4_1,
		quant.Q5_0, quant.Q5_1, quant.IQ4_NL, quant.Q2_K, quant.Q3_K, quant.Q4_K, quant.Q5_K, quant.Q6_K} {
		if !seen[ty] {
			t.Errorf("no golden model has a %v tensor", ty)
		}
	}
}

func TestVocab(t *testing.T) {
	for _, style := range []string{TokSPM, TokQwen2, TokQwen3, TokOLMo, TokDeepSeek} {
		for _, n := range []int{300, 480, 32000} {
			v, err := buildVocab(style, n)
			if err != nil {
				t.Fatal(err)
			}
			if len(v.tokens) != n || len(v.types) != n {
				t.Fatalf("%s/%d: %d tokens, %d types", style, n, len(v.tokens), len(v.types))
			}
			ids := map[string]int{}
			for i, tok := range v.tokens {
				if _, dup := ids[tok]; dup || tok == "" {
					t.Fatalf("%s/%d: token %d %q is empty or repeated", style, n, i, tok)
				}
				ids[tok] = i
			}
			for _, id := range []int{v.bos, v.eos} {
				if id < 0 || id >= n || v.types[id] != tokControl {
					t.Errorf("%s/%d: special id %d is not a control token", style, n, id)
				}
			}
			if style == TokSPM {
				// Byte fallback and the newline llama.cpp looks up.
				if ids["<0x0A>"] != 3+10 || len(v.scores) != n {
					t.Errorf("spm: byte tokens or scores missing")
				}
				continue
			}
			// Every merge joins two tokens into a token: llama.cpp maps merge results back to ids.
			for _, mg := range v.merges {
				a, b, ok := strings.Cut(mg, " ")
				if _, okA := ids[a]; !ok || !okA {
					t.Fatalf("%s: merge %q: %q is not a token", style, mg, a)
				}
				if _, okB := ids[b]; !okB {
					t.Fatalf("%s: merge %q: %q is not a token", style, mg, b)
				}
				if _, okAB := ids[a+b]; !okAB {
					t.Fatalf("%s: merge %q: result is not a token", style, mg)
				}
			}
			if _, ok := ids["Ċ"]; !ok {
				t.Errorf("%s: no newline byte token", style)
			}
		}
	}
}

// TestReadBack parses a written model with ollama's GGUF reader, independently of the writer's
// bookkeeping, and checks names, shapes, types and keys llama.cpp needs.
func TestReadBack(t *testing.T) {
	cases := map[string]map[string][]uint64{
		"deepseek2-mla-q4km": {
			"blk.1.attn_k_b.weight":      {32, 128, 4},
			"blk.1.attn_v_b.weight":      {128, 32, 4},
			"blk.1.attn_kv_a_mqa.weight": {256, 144},
			"blk.1.attn_q.weight":        {256, 192},
			"blk.0.ffn_down.weight":      {384, 256},
			"blk.2.ffn_down_exps.weight": {128, 256, 16},
			"blk.2.ffn_up_shexp.weight":  {256, 256},
		},
		"deepseek2-legacy-f32": {"blk.1.attn_kv_b.weight": {128, 256}},
		"qwen3moe-q3km": {
			"blk.0.attn_q.weight":       {256, 512},
			"blk.0.attn_k.weight":       {256, 256},
			"blk.0.attn_q_norm.weight":  {128},
			"blk.1.ffn_gate_inp.weight": {256, 16},
		},
		"qwen2moe-q4km": {
			"blk.0.ffn_gate_inp_shexp.weight": {256},
			"blk.0.attn_q.bias":               {256},
			"blk.1.ffn_down_shexp.weight":     {256, 256},
		},
		"olmoe-q8_0":   {"blk.0.attn_q_norm.weight": {256}, "blk.0.attn_k_norm.weight": {256}},
		"mixtral-q4km": {"blk.0.ffn_gate_exps.weight": {256, 256, 8}, "blk.0.attn_k.weight": {256, 128}},
		"qwen3-q2k":    {"token_embd.weight": {256, 400}},
	}
	for name, shapes := range cases {
		s, err := GoldenSpec(name)
		if err != nil {
			t.Fatal(err)
		}
		m, err := Build(s)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(t.TempDir(), name+".gguf")
		if _, err := m.Write(path); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		g, err := ggml.Decode(f, -1)
		f.Close()
		if err != nil {
			t.Fatalf("%s: decode: %v", name, err)
		}
		kv := g.KV()
		if kv.Architecture() != s.Arch || kv.Uint("block_count") != uint32(s.Layers) ||
			len(kv.Strings("tokenizer.ggml.tokens")) != s.Vocab {
			t.Errorf("%s: metadata: arch %s layers %d vocab %d", name, kv.Architecture(), kv.Uint("block_count"),
				len(kv.Strings("tokenizer.ggml.tokens")))
		}
		got := map[string]*ggml.Tensor{}
		for _, tn := range g.Tensors().Items() {
			got[tn.Name] = tn
		}
		if len(got) != len(m.Tensors) {
			t.Errorf("%s: %d tensors read back, %d written", name, len(got), len(m.Tensors))
		}
		for _, want := range m.Tensors {
			tn := got[want.Name]
			if tn == nil || tn.Kind != uint32(want.Type) || !slices.Equal(tn.Shape, want.Shape) {
				t.Errorf("%s: %s read back as %+v, want %v %v", name, want.Name, tn, want.Type, want.Shape)
			}
		}
		for tname, shape := range shapes {
			if tn := got[tname]; tn == nil || !slices.Equal(tn.Shape, shape) {
				t.Errorf("%s: %s has shape %v, want %v", name, tname, tn, shape)
			}
		}
		if s.Arch == ArchDeepSeek2 {
			for _, k := range []string{"attention.q_lora_rank", "attention.kv_lora_rank", "expert_shared_count",
				"rope.scaling.yarn_log_multiplier", "leading_dense_block_count"} {
				if kv.Value(s.Arch+"."+k) == nil {
					t.Errorf("%s: key %s missing", name, k)
				}
			}
		}
	}
}

func TestBench(t *testing.T) {
	s, err := Bench(ArchOLMoE, BenchOptions{Embd: 2048, Experts: 64, ExpertsUsed: 8, ExpertFFN: 1024, Layers: 4, Types: Q8_0})
	if err != nil {
		t.Fatal(err)
	}
	m, err := Build(s)
	if err != nil {
		t.Fatal(err)
	}
	if b := m.Bytes(); b < 1<<30 || b > 2<<30 {
		t.Errorf("olmoe bench model: %d bytes, want 1-2 GiB", b)
	}
	for name := range realShapes {
		s, err := BenchShape(name, BenchOptions{Layers: 2})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if _, err := Build(s); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	for arch := range archShapes {
		if _, err := Bench(arch, BenchOptions{Layers: 2}); err != nil {
			t.Fatalf("%s: %v", arch, err)
		}
	}
	if s, err := Bench(ArchLlama, BenchOptions{Experts: -1, Layers: 1}); err != nil || s.Experts != 0 {
		t.Fatalf("dense llama: %v %+v", err, s)
	}
}

func TestValidate(t *testing.T) {
	good, _ := GoldenSpec("qwen2moe-f32")
	bad := []func(*Spec){
		func(s *Spec) { s.Arch = "gpt-oss" },
		func(s *Spec) { s.ExpertsUsed = 9 },
		func(s *Spec) { s.SharedFFN = 0 },
		func(s *Spec) { s.HeadsKV = 3 },
		func(s *Spec) { s.Tokenizer = TokSPM },
		func(s *Spec) { s.Types = Recipe{Name: "x", Base: quant.Q8_K} },
	}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for i, f := range bad {
		s := good
		f(&s)
		if s.Validate() == nil {
			t.Errorf("bad spec %d accepted", i)
		}
	}
}

func TestRecipeFallback(t *testing.T) {
	r := q4kmGolden
	cases := []struct {
		role string
		ne0  int
		want quant.Type
	}{
		{"attn_q", 256, quant.Q4_K},
		{"ffn_down_exps", 128, quant.Q5_0}, // Q4_K -> Q5_0
		{"attn_output", 128, quant.Q5_1},   // Q5_K -> Q5_1
		{"output", 384, quant.Q8_0},        // Q6_K -> Q8_0
	}
	for _, c := range cases {
		if got := r.typeOf(slot{role: c.role, layer: 1}, c.ne0); got != c.want {
			t.Errorf("%s ne0 %d: %v, want %v", c.role, c.ne0, got, c.want)
		}
	}
	if got := Q2K.typeOf(slot{role: "attn_q"}, 128); got != quant.IQ4_NL {
		t.Errorf("Q2_K fallback: %v", got)
	}
	if got := q4kmGolden.typeOf(slot{role: "ffn_down_exps"}, 256); got != quant.Q6_K {
		t.Errorf("layer rule: %v", got)
	}
	if got := Q8_0.typeOf(slot{role: "attn_q"}, 48); got != quant.F16 {
		t.Errorf("no block fits 48: %v", got)
	}
	// The preset's choice falls back as the rules' does.
	if got := Q4KM.typeOf(slot{role: "output", layer: -1}, 384); got != quant.Q8_0 {
		t.Errorf("Q4_K_M's output of rows of 384: %v, want Q8_0", got)
	}
}
