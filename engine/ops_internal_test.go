package engine

import (
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"

	"github.com/commit-run/commit-run/cpu"
	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/models"
	"github.com/commit-run/commit-run/quant"
	"github.com/commit-run/commit-run/synth"
)

// charges records what a Charger was charged.
type charges struct {
	kinds        []string
	bytes, flops float64
}

func (c *charges) Charge(kind string, bytes, flops float64) {
	c.kinds = append(c.kinds, kind)
	c.bytes += bytes
	c.flops += flops
}

// TestChargedOps: on a device that prices work, the heads' products (MLA's k_b and v_b) are
// charged the weights they read and their multiply-adds, and compute the host's numbers.
func TestChargedOps(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	const heads, rows, cols, T = 3, 8, 32, 2
	w := make([]quant.Matrix, heads)
	for h := range w {
		f := make([]float32, rows*cols)
		for i := range f {
			f[i] = float32(r.NormFloat64())
		}
		rb, _ := quant.Q8_0.RowBytes(cols)
		w[h] = quant.Matrix{Type: quant.Q8_0, Rows: rows, Cols: cols, Data: make([]byte, rows*rb)}
		for i := 0; i < rows; i++ {
			quant.QuantizeRow(quant.Q8_0, f[i*cols:(i+1)*cols], w[h].Data[i*rb:(i+1)*rb])
		}
	}
	x := make([]float32, T*heads*cols)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	l := &device.HeadLayout{XTok: heads * cols, XHead: cols, OutTok: heads * rows, OutHead: rows}
	host := models.HostOps{K: cpu.New(1)}
	want, got := make([]float32, T*heads*rows), make([]float32, T*heads*rows)
	host.MatMulHeads(w, x, T, want, l)
	var c charges
	chargedOps{Ops: host, c: &c}.MatMulHeads(w, x, T, got, l)
	if !slices.Equal(got, want) {
		t.Error("the charged products differ from the host's")
	}
	if wb := float64(heads * len(w[0].Data)); c.bytes != wb || c.flops != 2*T*heads*rows*cols || !slices.Equal(c.kinds, []string{"attention"}) {
		t.Errorf("charged %v: %v bytes, %v flops; want one attention kernel of %v bytes, %v flops", c.kinds, c.bytes, c.flops, wb, 2*T*heads*rows*cols)
	}

	// A model with MLA charges its heads' products on the simulator, not on the CPU.
	spec, err := synth.GoldenSpec("deepseek2-mla-f32")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "mla.gguf")
	if _, err := synth.WriteFile(spec, path); err != nil {
		t.Fatal(err)
	}
	for dev, charged := range map[string]bool{"cpu": false, "sim:rtx4090": true} {
		m, err := Open(path, Options{Device: dev, Threads: 1, ContextLength: 32})
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := m.ops.(chargedOps); ok != charged {
			t.Errorf("%s: Ops %T", dev, m.ops)
		}
		m.Close()
	}
}

// TestChargedRecurrence: on a device that prices work, a DeltaNet layer's pass is charged its
// states once (the device's recurrence keeps them in registers through the pass) and each
// token's rows through its four kernels, and a token's work for every token.
func TestChargedRecurrence(t *testing.T) {
	spec, err := synth.GoldenSpec("qwen35moe-f32")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "qwen35moe.gguf")
	if _, err := synth.WriteFile(spec, path); err != nil {
		t.Fatal(err)
	}
	m, err := Open(path, Options{Device: "sim:rtx4090", Threads: 1, ContextLength: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	layer := -1
	for i, l := range m.arch.Layers {
		if _, ok := l.Attn.(*models.DeltaNet); ok {
			layer = i
			break
		}
	}
	if layer < 0 {
		t.Fatal("qwen35moe-f32 has no DeltaNet layer")
	}
	d := m.arch.Layers[layer].Attn.(*models.DeltaNet)
	conv, state := d.StateDims()
	perToken := 4 * float64(3*d.Channels()+4*d.KHeads*d.HeadDim+4*d.VHeads*d.HeadDim)
	for _, T := range []int{1, 64} {
		var c charges
		m.charger = &c
		m.chargeAttention(layer, T, 0)
		wantBytes, wantFlops := 8*float64(conv+state)+float64(T)*perToken, 6*float64(T)*float64(state)
		if c.bytes != wantBytes || c.flops != wantFlops || !slices.Equal(c.kinds, []string{"attention"}) {
			t.Errorf("%d tokens: charged %v, %v bytes, %v flops; want one attention kernel of %v bytes (the states once), %v flops",
				T, c.kinds, c.bytes, c.flops, wantBytes, wantFlops)
		}
	}
}
