package tinymoe

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/commit-run/commit-run/synth"
)

// Config is one model variant, read by both train.py and the exporter (configs/*.json).
type Config struct {
	Name        string  `json:"name"`
	Arch        string  `json:"arch"` // "llama" (Mixtral layout) or "qwen2moe"
	Comment     string  `json:"comment"`
	Layers      int     `json:"n_layer"`
	Embd        int     `json:"n_embd"`
	Heads       int     `json:"n_head"`
	HeadsKV     int     `json:"n_head_kv"`
	Experts     int     `json:"n_expert"`
	ExpertsUsed int     `json:"n_expert_used"`
	ExpertFFN   int     `json:"expert_ffn"`
	SharedFFN   int     `json:"shared_ffn"`
	NormTopK    bool    `json:"norm_topk"`
	Context     int     `json:"context"`
	RopeBase    float32 `json:"rope_base"`
	Eps         float32 `json:"eps"`
	Seed        int     `json:"seed"`
	Steps       int     `json:"steps"`
}

// LoadConfig reads a variant's config and checks that the GGUF architecture computes what
// train.py trains (the router's renormalisation is fixed by the architecture in llama.cpp).
func LoadConfig(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	var c Config
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	switch {
	case c.Arch == synth.ArchLlama && c.NormTopK && c.SharedFFN == 0:
	case c.Arch == synth.ArchQwen2MoE && !c.NormTopK && c.SharedFFN > 0:
	default:
		return nil, fmt.Errorf("config %s: arch %q with norm_topk=%v and shared_ffn=%d is not a layout llama.cpp computes", path, c.Arch, c.NormTopK, c.SharedFFN)
	}
	return &c, nil
}

// Spec is the config as a synth spec, which knows every architecture's metadata keys and
// tensor names; the exporter replaces its tokenizer and its weights.
func (c *Config) Spec(vocab int, recipe synth.Recipe) synth.Spec {
	return synth.Spec{
		Name: c.Name, Arch: c.Arch, Tokenizer: synth.TokOLMo, Vocab: vocab,
		Layers: c.Layers, Embd: c.Embd, Heads: c.Heads, HeadsKV: c.HeadsKV,
		Experts: c.Experts, ExpertsUsed: c.ExpertsUsed, ExpertFFN: c.ExpertFFN, SharedFFN: c.SharedFFN,
		Context: c.Context, RopeBase: c.RopeBase, Eps: c.Eps, Types: recipe,
	}
}
