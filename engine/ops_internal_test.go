package engine

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
	"unsafe"

	"github.com/commit-run/commit-run/cpu"
	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/models"
	"github.com/commit-run/commit-run/quant"
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
	path := goldenModel(t, "deepseek2-mla-f32")
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
	path := goldenModel(t, "qwen35moe-f32")
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

// pinner is a HostAllocator that pins up to left bytes, then refuses.
type pinner struct {
	left  int64
	given [][]byte
}

func (p *pinner) HostAlloc(n int64) ([]byte, error) {
	if n > p.left {
		return nil, errors.New("out of pinned memory")
	}
	p.left -= n
	b := make([]byte, n)
	p.given = append(p.given, b)
	return b, nil
}

// TestExchangeArenaPins holds the exchange arena's blocks to the device's pinned memory while
// it pins, and to Go memory, still zeroed and as large as asked, once it refuses; a reset
// reuses the blocks without pinning more.
func TestExchangeArenaPins(t *testing.T) {
	p := &pinner{left: 4 * hostBlockFloats}
	a := &arena{carve: true, pin: p}
	inPinned := func(x []float32) bool {
		a := uintptr(unsafe.Pointer(unsafe.SliceData(x)))
		for _, b := range p.given {
			lo := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
			if a >= lo && a+4*uintptr(len(x)) <= lo+uintptr(len(b)) {
				return true
			}
		}
		return false
	}
	x := a.floats(100)
	if !inPinned(x) || len(p.given) != 1 {
		t.Fatalf("the first block: pinned %v, %d pinned allocations", inPinned(x), len(p.given))
	}
	x[0] = 1
	big := a.floats(3 * hostBlockFloats) // more than the pinner has left: Go memory
	if inPinned(big) || len(big) != 3*hostBlockFloats || a.pin != nil {
		t.Fatalf("past the pinned memory: pinned %v, %d floats, still pinning %v", inPinned(big), len(big), a.pin != nil)
	}
	a.reset()
	again := a.floats(100)
	if !inPinned(again) || again[0] != 0 || len(p.given) != 1 {
		t.Errorf("after a reset: pinned %v, first float %v (want 0), %d pinned allocations (want 1)", inPinned(again), again[0], len(p.given))
	}
}
