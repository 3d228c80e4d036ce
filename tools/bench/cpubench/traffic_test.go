package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/commit-run/commit-run/models"
	"github.com/commit-run/commit-run/synth"
)

// writeSpec writes a synth spec into a test folder and opens it.
func writeSpec(t *testing.T, s synth.Spec) *models.File {
	t.Helper()
	path := filepath.Join(t.TempDir(), s.Name+".gguf")
	if _, err := synth.WriteFile(s, path); err != nil {
		t.Fatal(err)
	}
	f, err := models.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// TestTrafficQ8 checks the bytes per token of a small OLMoE in Q8_0 throughout against
// arithmetic on its shape: Q8_0 stores 32 weights in 34 bytes; norms and routers are F32.
func TestTrafficQ8(t *testing.T) {
	const (
		embd, heads, experts, topk, ffn, vocab, layers = 256, 4, 8, 2, 128, 400, 2
		hd                                             = embd / heads
	)
	q8 := func(n int64) int64 { return n / 32 * 34 }
	s, err := synth.Bench(synth.ArchOLMoE, synth.BenchOptions{Layers: layers, Embd: embd, Heads: heads,
		Experts: experts, ExpertsUsed: topk, ExpertFFN: ffn, Vocab: vocab, Types: synth.Q8_0, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	got, err := trafficOf(writeSpec(t, s))
	if err != nil {
		t.Fatal(err)
	}
	perLayerDense := 4*q8(embd*embd) + // q, k, v, output
		4*embd*4 + // attn_norm, ffn_norm, attn_q_norm, attn_k_norm (F32)
		embd*experts*4 // router (F32)
	want := traffic{
		Arch: "olmoe", Layers: layers, MoELayers: layers, Experts: experts, ExpertsUsed: topk,
		EmbedRow:      q8(embd),
		Head:          q8(embd * vocab),
		Dense:         layers*perLayerDense + embd*4, // + output_norm
		ExpertBytes:   layers * topk * 3 * q8(embd*ffn),
		KVPerPosition: layers * heads * (hd + hd) * 2,
	}
	if got != want {
		t.Errorf("traffic\n got %+v\nwant %+v", got, want)
	}
	if w := want.EmbedRow + want.Head + want.Dense + want.ExpertBytes; got.weights() != w {
		t.Errorf("weights() = %d, want %d", got.weights(), w)
	}
	if p := got.perToken(10); p != float64(got.weights()+10*want.KVPerPosition) {
		t.Errorf("perToken(10) = %g", p)
	}
}

// TestTrafficShapes checks the parts that depend on the architecture: a shared expert counts
// whole, a tied head reads the whole embedding table, MLA caches its latent.
func TestTrafficShapes(t *testing.T) {
	tiny, err := models.Open("../../../models/testdata/tiny.gguf")
	if err != nil {
		t.Fatal(err)
	}
	defer tiny.Close()
	tr, err := trafficOf(tiny)
	if err != nil {
		t.Fatal(err)
	}
	var exps, shexp int64
	for _, x := range tiny.Tensors {
		switch {
		case strings.HasSuffix(x.Name, "_exps.weight"):
			exps += x.Bytes()
		case strings.HasSuffix(x.Name, "_shexp.weight"):
			shexp += x.Bytes()
		}
	}
	// qwen2moe: 8 experts, top-4, so half of every expert tensor; the shared expert whole.
	if tr.ExpertsUsed != 4 || tr.Experts != 8 || tr.ExpertBytes != exps/2 || shexp == 0 || tr.Dense <= shexp {
		t.Errorf("tiny.gguf: %+v (expert tensors %d bytes, shared expert %d)", tr, exps, shexp)
	}
	if out := tiny.Tensor("output.weight"); tr.Head != out.Bytes() {
		t.Errorf("tiny.gguf head %d, want output.weight's %d", tr.Head, out.Bytes())
	}

	// Dense Qwen3 ties its head to token_embd.
	q3, err := synth.GoldenSpec("qwen3-q2k")
	if err != nil {
		t.Fatal(err)
	}
	f := writeSpec(t, q3)
	tr, err = trafficOf(f)
	if err != nil {
		t.Fatal(err)
	}
	if e := f.Tensor("token_embd.weight"); tr.Head != e.Bytes() || tr.EmbedRow != 0 || tr.ExpertBytes != 0 || tr.MoELayers != 0 {
		t.Errorf("tied qwen3: %+v, want the head to be token_embd's %d bytes", tr, e.Bytes())
	}
	// qwen3: key_length 128, 2 KV heads, 2 layers.
	if want := int64(2 * 2 * (128 + 128) * 2); tr.KVPerPosition != want {
		t.Errorf("qwen3 KV per position %d, want %d", tr.KVPerPosition, want)
	}

	// DeepSeek-V2 with MLA: kv_lora_rank 128 + rope 16 per layer, 3 layers.
	ds, err := synth.GoldenSpec("deepseek2-mla-q4km")
	if err != nil {
		t.Fatal(err)
	}
	tr, err = trafficOf(writeSpec(t, ds))
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(3 * (128 + 16) * 2); tr.KVPerPosition != want || tr.MoELayers != 2 {
		t.Errorf("deepseek2-mla: %+v, want %d KV bytes per position and 2 MoE layers", tr, want)
	}
}

func TestMeanPositions(t *testing.T) {
	for _, c := range []struct {
		prompt, steps int
		want          float64
	}{
		{1, 64, 33.5}, // steps attend over 2..65 positions
		{2048, 64, 2080.5},
		{5, 1, 6},
		{5, 0, 5},
	} {
		if got := meanPositions(c.prompt, c.steps); got != c.want {
			t.Errorf("meanPositions(%d, %d) = %g, want %g", c.prompt, c.steps, got, c.want)
		}
	}
}

func TestNewLimit(t *testing.T) {
	tr := traffic{EmbedRow: 1e3, Head: 4e6, Dense: 1e6, ExpertBytes: 5e6 - 1e3, KVPerPosition: 1000}
	l := newLimit(tr, 1, 1, 20) // 1e7 bytes of weights + 2 positions of 1000 bytes
	if l.BytesPerToken != 1e7+2000 || l.KVPositions != 2 {
		t.Errorf("limit %+v", l)
	}
	if want := 20e9 / (1e7 + 2000); l.TokS != want {
		t.Errorf("limit %g t/s, want %g", l.TokS, want)
	}
}

func TestReadTrafficErrors(t *testing.T) {
	if _, err := readTraffic(filepath.Join(t.TempDir(), "missing.gguf")); err == nil {
		t.Error("readTraffic of a missing file gave no error")
	}
	bad := filepath.Join(t.TempDir(), "bad.gguf")
	if err := os.WriteFile(bad, []byte("GGUF not really"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readTraffic(bad); err == nil {
		t.Error("readTraffic of a malformed file gave no error")
	}
}

// TestEstimateBytes checks the size estimate bounds a real file from above, within a few MB,
// with the full Qwen3 vocabulary (the largest metadata of the benchmark).
func TestEstimateBytes(t *testing.T) {
	s, err := synth.Bench(synth.ArchQwen3MoE, synth.BenchOptions{Layers: 1, Embd: 128, Heads: 1, HeadsKV: 1,
		Experts: 8, ExpertFFN: 32, Types: synth.Q8_0, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	est, err := estimateBytes(s)
	if err != nil {
		t.Fatal(err)
	}
	f := writeSpec(t, s)
	if est < f.Size || est > f.Size+16<<20 {
		t.Errorf("estimate %d bytes for a %d-byte file", est, f.Size)
	}
}
