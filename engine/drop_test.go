package engine_test

import (
	"context"
	"testing"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/multigpu"
)

// Capacity-aware token drop on the bundled model's held-out text (seeds/000 Tables 1-2 in
// small): nothing changes when the capacity holds every choice, the dropped share never rises
// with the capacity factor, and dropping by router score costs less perplexity than by order,
// reverse order or at random.
func TestTokenDropBundled(t *testing.T) {
	text := heldOutPrefix(t, 12000)
	po := engine.PerplexityOptions{Window: 256, MaxTokens: 1024}
	ppl := func(o *engine.DropOptions) (float64, float64) {
		m, err := engine.Open(bundledQwen, engine.Options{Drop: o})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		r, err := m.PerplexityWith(context.Background(), text, po)
		if err != nil {
			t.Fatal(err)
		}
		c, d, _ := m.DropStats()
		return r.Perplexity, float64(d) / float64(max(c, 1))
	}
	base, _ := ppl(nil)
	if p, d := ppl(&engine.DropOptions{Gamma: 100}); p != base || d != 0 {
		t.Errorf("a capacity that holds every choice: perplexity %v (base %v), %v dropped", p, base, d)
	}
	gammas := []float64{1, 1.5, 2}
	byScore := map[float64]float64{}
	for _, m := range []multigpu.DropMetric{multigpu.ByScore, multigpu.ByOrder, multigpu.ByReverseOrder, multigpu.ByRandom} {
		prev := 1.0
		for _, g := range gammas {
			p, d := ppl(&engine.DropOptions{Gamma: g, Metric: m, Seed: 1})
			t.Logf("%-7v gamma %.1f: perplexity %.4f (%+.2f%%), %.4f of choices dropped", m, g, p, 100*(p/base-1), d)
			if d > prev || d == 0 {
				t.Errorf("%v: gamma %v drops %v (a smaller gamma %v)", m, g, d, prev)
			}
			prev = d
			if m == multigpu.ByScore {
				byScore[g] = p
			} else if p <= byScore[g] {
				t.Errorf("gamma %v: dropping by %v gives perplexity %v, by score %v", g, m, p, byScore[g])
			}
		}
	}
}
