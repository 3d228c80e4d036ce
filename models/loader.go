package models

import (
	"fmt"

	"github.com/commit-run/commit-run/quant"
)

// loader fetches and shape-checks tensors, remembering the first error so architecture files
// read as a plain list of what they need.
type loader struct {
	f   *File
	c   *Config
	r   *kvReader
	err error
}

func newLoader(f *File, c *Config) *loader {
	return &loader{f: f, c: c, r: &kvReader{f: f, arch: c.Arch}}
}

func (l *loader) fail(err error) {
	if l.err == nil {
		l.err = err
	}
}

func (l *loader) get(name string, required bool, shape ...int) *Tensor {
	t := l.f.Tensor(name)
	if t == nil {
		if required {
			l.fail(fmt.Errorf("tensor %q is missing", name))
		}
		return nil
	}
	if shape != nil {
		if err := t.checkShape(shape...); err != nil {
			l.fail(err)
			return nil
		}
	}
	return t
}

func (l *loader) tensor(name string, shape ...int) *Tensor { return l.get(name, true, shape...) }

func (l *loader) optional(name string, shape ...int) *Tensor { return l.get(name, false, shape...) }

func (l *loader) matrix(name string, cols, rows int) quant.Matrix {
	if t := l.tensor(name, cols, rows); t != nil {
		return t.Matrix()
	}
	return quant.Matrix{}
}

func (l *loader) vec(name string, n int, required bool) []float32 {
	if t := l.get(name, required, n); t != nil {
		return t.Float32s()
	}
	return nil
}

func (l *loader) norm(prefix string, n int) Norm {
	return Norm{Weight: l.vec(prefix+".weight", n, true), Bias: l.vec(prefix+".bias", n, false)}
}

// embeddings loads token_embd, output_norm and output (tied to token_embd when absent).
func (l *loader) embeddings(m *Model) {
	c := l.c
	m.TokenEmbd = l.tensor("token_embd.weight")
	if m.TokenEmbd == nil {
		return
	}
	if len(m.TokenEmbd.Ne) != 2 || m.TokenEmbd.Ne[0] != c.Embd {
		l.fail(fmt.Errorf("tensor %q has shape %v, want {%d, n_vocab}", m.TokenEmbd.Name, m.TokenEmbd.Ne, c.Embd))
		return
	}
	c.Vocab = m.TokenEmbd.Ne[1]
	m.OutputNorm = l.norm("output_norm", c.Embd)
	m.Output = l.optional("output.weight", c.Embd, c.Vocab)
	if m.Output == nil {
		m.Output = m.TokenEmbd
	}
}

// ffn loads a dense SwiGLU block named ffn_{gate,up,down}<suffix>.
func (l *loader) ffn(p, suffix string) *FFN {
	g := l.tensor(p + "ffn_gate" + suffix + ".weight")
	if g == nil {
		return nil
	}
	if len(g.Ne) != 2 {
		l.fail(fmt.Errorf("tensor %q has shape %v, want 2-D", g.Name, g.Ne))
		return nil
	}
	nff := g.Ne[1]
	return &FFN{
		Gate: l.matrix(p+"ffn_gate"+suffix+".weight", l.c.Embd, nff),
		Up:   l.matrix(p+"ffn_up"+suffix+".weight", l.c.Embd, nff),
		Down: l.matrix(p+"ffn_down"+suffix+".weight", nff, l.c.Embd),
	}
}

// moe loads the routed experts of layer prefix p; the caller sets the gating details.
func (l *loader) moe(p string) *MoE {
	c := l.c
	if c.Experts <= 0 {
		l.fail(fmt.Errorf("%sffn_gate_inp exists but expert_count is %d", p, c.Experts))
		return nil
	}
	m := &MoE{Experts: c.Experts, Used: c.ExpertsUsed, Gating: GatingSoftmax}
	m.Router = l.tensor(p+"ffn_gate_inp.weight", c.Embd, c.Experts)
	m.GateExps = l.tensor(p + "ffn_gate_exps.weight")
	if m.GateExps == nil || len(m.GateExps.Ne) != 3 {
		l.fail(fmt.Errorf("tensor %sffn_gate_exps.weight is missing or not 3-D", p))
		return nil
	}
	nff := m.GateExps.Ne[1]
	if c.ExpertFFN != 0 && c.ExpertFFN != nff {
		l.fail(fmt.Errorf("%sffn_gate_exps has expert width %d, metadata says %d", p, nff, c.ExpertFFN))
	}
	m.GateExps = l.tensor(p+"ffn_gate_exps.weight", c.Embd, nff, c.Experts)
	m.UpExps = l.tensor(p+"ffn_up_exps.weight", c.Embd, nff, c.Experts)
	m.DownExps = l.tensor(p+"ffn_down_exps.weight", nff, c.Embd, c.Experts)
	m.SelectionBias = l.vec(p+"exp_probs_b.bias", c.Experts, false)
	if l.c.ExpertFFN == 0 {
		l.c.ExpertFFN = nff
	}
	return m
}

// expertGroups reads DeepSeek-V3's expert groups (0, 0: none) and refuses the counts
// llama.cpp asserts against: the groups must split the experts evenly, in groups of at
// least two (a group scores its two best experts), and leave some out.
func (l *loader) expertGroups() (groups, used int) {
	r, c := l.r, l.c
	groups = r.int(".expert_group_count", 0, false)
	used = r.int(".expert_group_used_count", 0, false)
	if r.err != nil {
		l.fail(r.err)
		return 0, 0
	}
	if groups <= 1 {
		return 0, 0
	}
	switch {
	case c.Experts <= 0 || groups >= c.Experts || c.Experts%groups != 0:
		l.fail(fmt.Errorf("metadata key %q: %d groups cannot split %d experts evenly into groups of two or more", r.key(".expert_group_count"), groups, c.Experts))
	case used <= 0 || used >= groups:
		l.fail(fmt.Errorf("metadata key %q: %d of %d groups (want 1 to %d)", r.key(".expert_group_used_count"), used, groups, groups-1))
	default:
		return groups, used
	}
	return 0, 0
}

// nextn takes the file's last nextn_predict_layers blocks out of the model's layers: GLM's
// multi-token-prediction blocks (glm4moe, and GLM-4.7-Flash as deepseek2), which llama.cpp
// loads but its decoder never runs. It must run before anything reads c.Layers.
func (l *loader) nextn() error {
	r, c := l.r, l.c
	n := r.int(".nextn_predict_layers", 0, false)
	if r.err != nil {
		return r.err
	}
	if n >= c.Layers {
		return fmt.Errorf("metadata key %q: %d next-token-prediction blocks of %d leave no layers", r.key(".nextn_predict_layers"), n, c.Layers)
	}
	c.Layers -= n
	c.NextN = n
	c.Heads, c.HeadsKV, c.FFN = c.Heads[:c.Layers], c.HeadsKV[:c.Layers], c.FFN[:c.Layers]
	return nil
}

func (l *loader) rope(neox bool) *Rope {
	r := l.c.Rope
	r.NeoX = neox
	if t := l.optional("rope_freqs.weight", r.Dims/2); t != nil {
		r.FreqFactors = t.Float32s()
	}
	return &r
}

func (l *loader) done(m *Model) (*Model, error) {
	if l.err != nil {
		return nil, l.err
	}
	return m, nil
}
