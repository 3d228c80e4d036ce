package models

import (
	"fmt"
	"math"
)

// Config holds the hyper-parameters every architecture shares, read from the GGUF metadata
// with llama.cpp's defaults.
type Config struct {
	Arch        string
	Layers      int
	Embd        int
	Vocab       int
	ContextLen  int // training context
	Heads       []int
	HeadsKV     []int
	FFN         []int // dense feed-forward length per layer
	HeadDimK    int
	HeadDimV    int
	NormEps     float32
	Rope        Rope
	Experts     int // routed experts, 0 for dense
	ExpertsUsed int
	ExpertFFN   int
	SharedFFN   int // total shared-expert ffn length (qwen2moe: one expert; deepseek2: count*expert ffn)
	Shared      int // shared expert count
	DenseLead   int // leading dense layers (deepseek2)
	// NextN counts the blocks after Layers that the file holds but no pass runs: GLM's
	// multi-token-prediction layers (glm4moe nextn_predict_layers).
	NextN int
}

// Skipped says whether the tensor named name belongs to a block the file holds but the model
// never runs (Config.NextN), which must not be uploaded, placed or counted as the model's.
func (c *Config) Skipped(name string) bool {
	if c.NextN == 0 {
		return false
	}
	var n int
	var rest string
	if k, err := fmt.Sscanf(name, "blk.%d.%s", &n, &rest); err != nil || k != 2 {
		return false
	}
	return n >= c.Layers && n < c.Layers+c.NextN
}

// Rope holds rotary-embedding settings, including YaRN's.
type Rope struct {
	Dims       int     // rotated dimensions per head
	NeoX       bool    // rotate (i, i+d/2) instead of adjacent pairs
	FreqBase   float32 // base of theta
	FreqScale  float32 // 1/scaling factor (linear or YaRN)
	ExtFactor  float32 // YaRN extrapolation mix, 0 = off
	AttnFactor float32 // magnitude applied to cos/sin
	BetaFast   float32
	BetaSlow   float32
	OrigCtx    int
	// FreqFactors divides theta per rotated pair (llama 3 style rope_freqs), or nil.
	FreqFactors []float32
}

// kvReader reads metadata tolerantly: llama.cpp accepts any integer type for an integer key
// and a scalar wherever a per-layer array is allowed, and so do we.
type kvReader struct {
	f    *File
	arch string
	err  error
}

func (r *kvReader) key(k string) string {
	if len(k) > 0 && k[0] == '.' {
		return r.arch + k
	}
	return k
}

func (r *kvReader) has(k string) bool { _, ok := r.f.KV[r.key(k)]; return ok }

func toInt(v any) (int64, bool) {
	switch x := v.(type) {
	case uint8:
		return int64(x), true
	case int8:
		return int64(x), true
	case uint16:
		return int64(x), true
	case int16:
		return int64(x), true
	case uint32:
		return int64(x), true
	case int32:
		return int64(x), true
	case uint64:
		if x > math.MaxInt32 {
			return 0, false
		}
		return int64(x), true
	case int64:
		return x, true
	case bool:
		if x {
			return 1, true
		}
		return 0, true
	}
	return 0, false
}

// int returns an integer key, def when absent; required keys fail when absent.
func (r *kvReader) int(k string, def int, required bool) int {
	v, ok := r.f.KV[r.key(k)]
	if !ok {
		if required && r.err == nil {
			r.err = fmt.Errorf("metadata key %q is missing", r.key(k))
		}
		return def
	}
	n, ok := toInt(v)
	if !ok || n < 0 || n > math.MaxInt32 {
		if r.err == nil {
			r.err = fmt.Errorf("metadata key %q: %v is not a usable integer", r.key(k), v)
		}
		return def
	}
	return int(n)
}

func (r *kvReader) float(k string, def float32) float32 {
	v, ok := r.f.KV[r.key(k)]
	if !ok {
		return def
	}
	switch x := v.(type) {
	case float32:
		return x
	case float64:
		return float32(x)
	}
	if n, ok := toInt(v); ok {
		return float32(n)
	}
	if r.err == nil {
		r.err = fmt.Errorf("metadata key %q: %v is not a number", r.key(k), v)
	}
	return def
}

func (r *kvReader) bool(k string, def bool) bool {
	v, ok := r.f.KV[r.key(k)]
	if !ok {
		return def
	}
	if b, ok := v.(bool); ok {
		return b
	}
	if n, ok := toInt(v); ok {
		return n != 0
	}
	return def
}

func (r *kvReader) str(k, def string) string {
	if s, ok := r.f.KV[r.key(k)].(string); ok {
		return s
	}
	return def
}

// uints returns an integer array key's values, nil when absent: from a decoded file's array,
// or from the Go slices that built metadata (a virtual file's, NewVirtualFile) holds, which
// ggml's accessors take for absent keys.
func (r *kvReader) uints(k string) []uint32 {
	switch v := r.f.KV[r.key(k)].(type) {
	case nil:
		return nil
	case []uint32:
		return v
	case []int32:
		out := make([]uint32, len(v))
		for i, x := range v {
			out[i] = uint32(x)
		}
		return out
	}
	return r.f.KV.UintOrArrayValueAsArray(r.key(k)[len(r.arch)+1:], 0)
}

// perLayer reads a key that may be a scalar or an array of n values.
func (r *kvReader) perLayer(k string, n, def int, required bool) []int {
	out := make([]int, n)
	v, ok := r.f.KV[r.key(k)]
	if !ok {
		if required && r.err == nil {
			r.err = fmt.Errorf("metadata key %q is missing", r.key(k))
		}
		for i := range out {
			out[i] = def
		}
		return out
	}
	if x, ok := toInt(v); ok {
		for i := range out {
			out[i] = int(x)
		}
		return out
	}
	vals := r.uints(k)
	if len(vals) != n {
		if r.err == nil {
			r.err = fmt.Errorf("metadata key %q has %d values, want 1 or %d (one per layer)", r.key(k), len(vals), n)
		}
		return out
	}
	for i, x := range vals {
		out[i] = int(x)
	}
	return out
}

// readConfig reads the shared hyper-parameters. Architecture files adjust what differs.
func readConfig(f *File) (*Config, error) {
	arch := f.Architecture()
	r := &kvReader{f: f, arch: arch}
	c := &Config{Arch: arch}
	c.Layers = r.int(".block_count", 0, true)
	c.Embd = r.int(".embedding_length", 0, true)
	c.ContextLen = r.int(".context_length", 2048, false)
	if r.err != nil {
		return nil, r.err
	}
	if c.Layers <= 0 || c.Layers > 4096 || c.Embd <= 0 || c.Embd > 1<<20 {
		return nil, fmt.Errorf("implausible hyper-parameters: %d layers of width %d", c.Layers, c.Embd)
	}
	c.Heads = r.perLayer(".attention.head_count", c.Layers, 0, true)
	c.HeadsKV = r.perLayer(".attention.head_count_kv", c.Layers, -1, false)
	for i := range c.HeadsKV {
		if c.HeadsKV[i] < 0 {
			c.HeadsKV[i] = c.Heads[i]
		}
	}
	c.FFN = r.perLayer(".feed_forward_length", c.Layers, 0, false)
	if r.err != nil {
		return nil, r.err
	}
	for i := range c.Heads {
		if c.Heads[i] <= 0 || c.HeadsKV[i] <= 0 || c.Heads[i]%c.HeadsKV[i] != 0 {
			return nil, fmt.Errorf("layer %d: %d query heads cannot share %d key/value heads", i, c.Heads[i], c.HeadsKV[i])
		}
	}
	c.HeadDimK = r.int(".attention.key_length", c.Embd/c.Heads[0], false)
	c.HeadDimV = r.int(".attention.value_length", c.Embd/c.Heads[0], false)
	c.NormEps = r.float(".attention.layer_norm_rms_epsilon", 1e-5)
	c.Experts = r.int(".expert_count", 0, false)
	c.ExpertsUsed = r.int(".expert_used_count", 0, false)
	if c.Experts > 0 && (c.ExpertsUsed <= 0 || c.ExpertsUsed > c.Experts) {
		return nil, fmt.Errorf("metadata says top-%d of %d experts", c.ExpertsUsed, c.Experts)
	}
	c.ExpertFFN = r.int(".expert_feed_forward_length", 0, false)
	c.Shared = r.int(".expert_shared_count", 0, false)
	c.DenseLead = r.int(".leading_dense_block_count", 0, false)

	ro := &c.Rope
	ro.Dims = r.int(".rope.dimension_count", c.HeadDimK, false)
	ro.FreqBase = r.float(".rope.freq_base", 10000)
	scaling := r.str(".rope.scaling.type", "linear")
	factor := r.float(".rope.scaling.factor", 0)
	if factor == 0 {
		factor = r.float(".rope.scale_linear", 0)
	}
	ro.FreqScale = 1
	if factor != 0 {
		ro.FreqScale = 1 / factor
	}
	ro.OrigCtx = r.int(".rope.scaling.original_context_length", c.ContextLen, false)
	ro.BetaFast = r.float(".rope.scaling.yarn_beta_fast", 32)
	ro.BetaSlow = r.float(".rope.scaling.yarn_beta_slow", 1)
	ro.AttnFactor = 1
	switch scaling {
	case "none":
		ro.FreqScale = 1
	case "linear":
	case "yarn":
		ro.ExtFactor = 1
		// llama.cpp's default YaRN magnitude, then cancelled against the factor ggml's rope
		// multiplies in again, so the net cos/sin magnitude is get_mscale(factor).
		ro.AttnFactor = yarnMScale(1/ro.FreqScale, 1) / (1 + 0.1*float32(math.Log(float64(1/ro.FreqScale))))
	default:
		return nil, fmt.Errorf("rope scaling type %q is not supported (want none, linear or yarn)", scaling)
	}
	ro.AttnFactor *= r.float(".rope.scaling.attn_factor", 1)
	if r.err != nil {
		return nil, r.err
	}
	if c.HeadDimK <= 0 || c.HeadDimV <= 0 || ro.Dims <= 0 || ro.Dims > c.HeadDimK || ro.Dims%2 != 0 {
		return nil, fmt.Errorf("implausible head sizes: k %d, v %d, rope %d", c.HeadDimK, c.HeadDimV, ro.Dims)
	}
	return c, nil
}

func yarnMScale(scale, mscale float32) float32 {
	if scale <= 1 {
		return 1
	}
	return 0.1*mscale*float32(math.Log(float64(scale))) + 1
}
