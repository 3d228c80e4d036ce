package engine

import (
	"math"
	"testing"

	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/quant"
)

// expertRows counts the activation rows a pass gives the routed experts' products.
type expertRows struct {
	device.Device
	rows int
}

func (c *expertRows) MatMulID(w quant.Matrix, x []float32, T int, out []float32) {
	c.rows += T
	c.Device.MatMulID(w, x, T, out)
}

// TestPromptLastRow: a prompt pass that wants only the last token's logits runs the last
// block's experts for that token alone, and its logits are those of the pass that runs every
// row through, bit for bit; where a batch's rows share a plan (token drop), all rows go on.
func TestPromptLastRow(t *testing.T) {
	for _, path := range []string{"../models/testdata/tinymoe-qwen2moe.gguf", "../models/testdata/tinymoe-mixtral.gguf"} {
		for _, drop := range []bool{false, true} {
			o := Options{Threads: 2, KVType: "f32", ContextLength: 64}
			if drop {
				o.Drop = &DropOptions{Gamma: 1.5}
			}
			m, err := Open(path, o)
			if err != nil {
				t.Fatal(err)
			}
			tokens, err := m.Tokenize("The old prince went to the window and looked out at the snow.", true)
			if err != nil {
				t.Fatal(err)
			}
			T := len(tokens)
			count := &expertRows{Device: m.dev}
			m.dev = count
			// An observer wants every row's routing, so with one every row goes on.
			pass := func(obs RouteObserver) ([]float32, int) {
				kv, err := m.newKV()
				if err != nil {
					t.Fatal(err)
				}
				count.rows = 0
				logits, err := m.forward(kv, tokens, 0, false, obs, nil)
				if err != nil {
					t.Fatal(err)
				}
				return logits, count.rows
			}
			every, everyRows := pass(func(*RouteEvent) {})
			last, lastRows := pass(nil)
			for i, v := range last {
				if math.Float32bits(v) != math.Float32bits(every[i]) {
					t.Fatalf("%s (drop %v): logit %d is %v, %v in the pass over every row", path, drop, i, v, every[i])
				}
			}
			// Each MoE block's experts see T*k rows (a few matrices each); the last block's
			// see k rows when the others are dropped.
			moe := len(m.info.MoELayers)
			perRow := everyRows / (moe * T)
			want := everyRows
			if !drop {
				want = perRow * ((moe-1)*T + 1)
			}
			if lastRows != want {
				t.Errorf("%s (drop %v): the experts saw %d rows, want %d (%d over every row)", path, drop, lastRows, want, everyRows)
			}
			m.dev = count.Device
			m.Close()
		}
	}
}
