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

// TestPromptCut: a prompt's passes run the last block's experts only for the rows whose
// logits are asked for (the last token's, none in a batch before the last), and the logits
// are those of the passes that run every row through, bit for bit, so the cache they leave
// is too; where a batch's rows share a plan (token drop), every row goes on.
func TestPromptCut(t *testing.T) {
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
			count := &expertRows{Device: m.dev}
			m.dev = count
			// The prompt in two batches, as Session.eval runs a long one. An observer wants
			// every row's routing, so with one every row goes on.
			split := len(tokens) / 2
			prompt := func(obs RouteObserver) ([]float32, [2]int) {
				kv, err := m.newKV()
				if err != nil {
					t.Fatal(err)
				}
				var rows [2]int
				var logits []float32
				for j, batch := range [][]int32{tokens[:split], tokens[split:]} {
					want := noLogits
					if j == 1 {
						want = lastLogits
					}
					count.rows = 0
					logits, err = m.forward(kv, batch, j*split, want, obs, nil)
					if err != nil {
						t.Fatal(err)
					}
					if j == 0 && logits != nil {
						t.Fatalf("%s: a pass that wants no logits returned %d", path, len(logits))
					}
					rows[j] = count.rows
				}
				return logits, rows
			}
			every, everyRows := prompt(func(*RouteEvent) {})
			last, lastRows := prompt(nil)
			for i, v := range last {
				if math.Float32bits(v) != math.Float32bits(every[i]) {
					t.Fatalf("%s (drop %v): logit %d is %v, %v in the passes over every row", path, drop, i, v, every[i])
				}
			}
			// Each MoE block's experts see T*k rows (a few matrices each); the last block's
			// see none in the first batch and k rows in the second, unless rows share a plan.
			moe := len(m.info.MoELayers)
			perRow := everyRows[0] / (moe * split)
			want := everyRows
			if !drop {
				want = [2]int{perRow * (moe - 1) * split, perRow * ((moe-1)*(len(tokens)-split) + 1)}
			}
			if lastRows != want {
				t.Errorf("%s (drop %v): the experts saw %v rows, want %v (%v over every row)", path, drop, lastRows, want, everyRows)
			}
			m.dev = count.Device
			m.Close()
		}
	}
}
