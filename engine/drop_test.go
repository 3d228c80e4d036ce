package engine_test

import (
	"context"
	"math"
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
		p, st := dropPerplexity(t, bundledQwen, text, po, o)
		return p, float64(st.Dropped) / float64(max(st.Choices, 1))
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

// Expanded drop and device-level capacity on the bundled models, planned for 4 devices:
// expanded drop drops the choices token drop drops and computes extra experts of the
// tokens' own devices; device-level capacity drops fewer choices than expert-level; with every
// choice within capacity nothing changes.
func TestExpandedDropBundled(t *testing.T) {
	text := heldOutPrefix(t, 6000)
	po := engine.PerplexityOptions{Window: 256, MaxTokens: 512}
	for _, path := range []string{bundledQwen, bundledMixtral} {
		run := func(o *engine.DropOptions) (float64, engine.DropStats) { return dropPerplexity(t, path, text, po, o) }
		base, _ := run(nil)
		if p, st := run(&engine.DropOptions{Gamma: 1000, Expand: true, Devices: 4}); p == base || st.Dropped != 0 || st.Added == 0 {
			// A capacity that holds every offer computes every local expert for every token.
			t.Errorf("%s: unbounded expanded drop: perplexity %v (base %v), %+v", path, p, base, st)
		}
		if p, st := run(&engine.DropOptions{Gamma: 1000, Devices: 4, DeviceLevel: true}); p != base || st.Dropped != 0 {
			t.Errorf("%s: unbounded device-level drop: perplexity %v (base %v), %+v", path, p, base, st)
		}
		pt, td := run(&engine.DropOptions{Gamma: 1, Devices: 4})
		pe, ed := run(&engine.DropOptions{Gamma: 1, Devices: 4, Expand: true})
		_, dd := run(&engine.DropOptions{Gamma: 1, Devices: 4, DeviceLevel: true})
		t.Logf("%s: base %.4f, token drop %.4f (%+v), expanded %.4f (%+v), device-level %+v", path, base, pt, td, pe, ed, dd)
		// The added experts change later layers' inputs and so their routing: the drops
		// agree within a few percent, not exactly (multigpu tests the same batch).
		if math.Abs(float64(ed.Dropped-td.Dropped)) > 0.03*float64(td.Dropped) || ed.Added == 0 || pe == pt {
			t.Errorf("%s: expanded drop %+v against token drop %+v", path, ed, td)
		}
		if dd.Dropped >= td.Dropped {
			t.Errorf("%s: device-level capacity drops %d, expert-level %d", path, dd.Dropped, td.Dropped)
		}
	}
	if _, err := engine.Open(bundledQwen, engine.Options{Drop: &engine.DropOptions{Gamma: 1, Devices: 17}}); err == nil {
		t.Error("token drop over 17 devices for 16 experts: no error")
	}
}

// dropPerplexity is the perplexity of text under token drop o (nil: none) and its counts.
func dropPerplexity(t *testing.T, path, text string, po engine.PerplexityOptions, o *engine.DropOptions) (float64, engine.DropStats) {
	t.Helper()
	m, err := engine.Open(path, engine.Options{Drop: o})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	r, err := m.PerplexityWith(context.Background(), text, po)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := m.DropStats()
	return r.Perplexity, st
}
