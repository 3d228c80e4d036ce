package cuda

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/commit-run/commit-run/quant"
)

// TestGPUParamRing sums with mixing weights from the host far beyond the parameter ring's
// megabyte, its halves taken in turn: every sum reads its own weights.
func TestGPUParamRing(t *testing.T) {
	g := openFakeGPU(t, GPUOptions{})
	const k, d, rounds = 4000, 32, 150 // 16 KB of weights a round, 2.4 MB in all
	ys := deviceFloats(t, g, k*d, slices.Repeat([]float32{1}, k*d))
	out := deviceFloats(t, g, rounds*d, nil)
	w := make([]float32, k)
	for i := 0; i < rounds; i++ {
		var sum float32
		for j := range w {
			w[j] = float32((i + j) % 7) // small integers: the sums are exact
			sum += w[j]
		}
		g.Combine(out[i*d:(i+1)*d], ys, w, []int32{0, k}, d)
		want := slices.Repeat([]float32{sum}, d)
		if i%50 == 0 || i == rounds-1 {
			checkBits(t, "sum", hostFloats(g, out[i*d:(i+1)*d]), want)
		}
	}
	if err := g.Err(); err != nil {
		t.Fatal(err)
	}
	if !g.ringUsed[0] || !g.ringUsed[1] {
		t.Errorf("the ring's halves used: %v", g.ringUsed)
	}
}

// TestGPUStepCapture captures a step of operations and replays it at other positions and
// tokens; an operation a graph cannot hold fails the capture and leaves the GPU working.
func TestGPUStepCapture(t *testing.T) {
	g := openFakeGPU(t, GPUOptions{})
	r := rand.New(rand.NewPCG(7, 7))
	const rows, d = 16, 32
	table := randF32(r, rows*d, 1)
	wf := deviceFloats(t, g, rows*d, table)
	emb := quant.Matrix{Type: quant.F32, Rows: rows, Cols: d, Data: floatBytes(wf)}
	dst := deviceFloats(t, g, d, nil)

	// A step of one embedding lookup: its token comes from the step's inputs.
	if err := g.BeginStep([]int32{3}, 5); err != nil {
		t.Fatal(err)
	}
	g.Embed(dst, emb, []int32{3})
	step, err := g.EndStep()
	if err != nil {
		t.Fatal(err)
	}
	defer g.ReleaseStep(step)
	for _, tok := range []int32{7, 0, 15} {
		if err := g.Replay(step, []int32{tok}, 9); err != nil {
			t.Fatal(err)
		}
		checkBits(t, "row", hostFloats(g, dst), table[int(tok)*d:int(tok+1)*d])
	}
	if err := g.Replay(step, []int32{1, 2}, 9); err == nil {
		t.Error("a replay with two tokens of a step captured with one")
	}
	if s := g.Stats(); s.GraphLaunches != 3 || s.Kernels < 3 {
		t.Errorf("after 3 replays: %+v", s)
	}

	// A read the host waits for cannot be captured: EndStep fails, nothing ran, the GPU goes on.
	if err := g.BeginStep([]int32{1}, 0); err != nil {
		t.Fatal(err)
	}
	g.Embed(dst, emb, []int32{1})
	g.Read(make([]float32, d), dst)
	if _, err := g.EndStep(); err == nil || !strings.Contains(err.Error(), "cannot be captured") {
		t.Errorf("EndStep after a read = %v", err)
	}
	if err := g.Err(); err != nil {
		t.Fatalf("a failed capture left the GPU failed: %v", err)
	}
	g.Embed(dst, emb, []int32{2})
	checkBits(t, "row after the failed capture", hostFloats(g, dst), table[2*d:3*d])
}
