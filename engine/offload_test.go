package engine_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/offload"
	"github.com/commit-run/commit-run/tools/golden/fixture"
)

// offloadProbe opens path with opts' device and offloading, the budget 1 GiB (room for every
// expert of a test model), for the store's slot size and what stays resident on that device.
func offloadProbe(t *testing.T, path string, opts engine.Options) engine.OffloadStats {
	t.Helper()
	o := *opts.Offload
	o.GPUMem = 1 << 30
	opts.Offload = &o
	m, err := engine.Open(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	st, _ := m.Offload()
	return st
}

// offloadRun evaluates prompt (every position's distribution) and a short greedy continuation.
func offloadRun(t *testing.T, path string, opts engine.Options, prompt []int32) ([][]float32, []int32) {
	t.Helper()
	r := runOn(t, path, opts, prompt, 6)
	return r.probs, r.tokens
}

// TestOffloadKeepsTheNumbers runs every golden and bundled MoE model with each policy at a
// budget that holds only one layer's top-k (two for prefetch; the device layers' experts for
// the splits, which leaves static-cache no cache), one between, and one that holds every
// expert: every probability and every greedy token must equal the run without
// offloading, bit for bit.
func TestOffloadKeepsTheNumbers(t *testing.T) {
	fxs, err := fixture.LoadDir(goldenDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, fx := range fxs {
		t.Run(fx.Name, func(t *testing.T) {
			path := goldenModel(t, fx)
			info, err := engine.Inspect(path)
			if err != nil {
				t.Fatal(err)
			}
			if info.Experts == 0 {
				t.Skipf("%s is dense: nothing to offload", fx.Name)
			}
			base := engine.Options{Threads: 2, KVType: "f32", ContextLength: 64}
			wantP, wantG := offloadRun(t, path, base, fx.Prompt)
			L := len(info.MoELayers)
			for _, pol := range []offload.Policy{offload.OnDemand, offload.Prefetch, offload.Commit, offload.CPUMiss, offload.Static, offload.StaticCache, offload.Hot} {
				o := base
				o.Offload = &engine.OffloadOptions{Policy: pol, Predictor: map[offload.Policy]string{offload.Prefetch: "prev-token", offload.Commit: "oracle"}[pol]}
				k := int64(info.ExpertsUsed)
				switch pol {
				case offload.Prefetch:
					k *= 2
				case offload.Static, offload.StaticCache:
					// The host computes the first half of the MoE layers; the device holds
					// the others' experts, and static-cache caches the host's beside them.
					o.Offload.HostLayers = (L + 1) / 2
					k = int64(max(1, (L-o.Offload.HostLayers)*info.Experts))
				}
				all := int64(info.Experts * L)
				// The simulated GPU computes on the CPU but orders every copy and kernel by
				// events, and cpu-miss there weighs host against copy per expert.
				for _, dev := range []string{"cpu", "sim:rtx2080ti"} {
					o.Device = dev
					st := offloadProbe(t, path, o)
					for _, slots := range []int64{k, (k + all) / 2, all} {
						o.Offload.GPUMem = st.Resident + slots*st.SlotBytes
						gotP, gotG := offloadRun(t, path, o, fx.Prompt)
						if !slices.Equal(gotG, wantG) {
							t.Fatalf("%s on %s, %d slots: greedy %v, without offloading %v", pol, dev, slots, gotG, wantG)
						}
						for pos := range wantP {
							if !slices.Equal(gotP[pos], wantP[pos]) {
								t.Fatalf("%s on %s, %d slots: probabilities differ at position %d", pol, dev, slots, pos)
							}
						}
					}
				}
			}
		})
	}
}

func TestOffloadBudget(t *testing.T) {
	big := engine.Options{Offload: &engine.OffloadOptions{Policy: offload.OnDemand, GPUMem: 1 << 40}, ContextLength: 64}
	m, err := engine.Open(tinyModel, big)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := m.Offload()
	m.Close()
	info, _ := engine.Inspect(tinyModel)

	// One slot short of top-k: refused at load time, saying how much is needed.
	o := big
	need := st.Resident + int64(info.ExpertsUsed)*st.SlotBytes
	o.Offload = &engine.OffloadOptions{Policy: offload.OnDemand, GPUMem: need - 1}
	_, err = engine.Open(tinyModel, o)
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("at least %d bytes", need)) {
		t.Errorf("budget %d: %v, want an error naming %d bytes", need-1, err, need)
	}
	// The smallest budget runs one session; a second one's KV cache does not fit.
	o.Offload = &engine.OffloadOptions{Policy: offload.OnDemand, GPUMem: need}
	m, err = engine.Open(tinyModel, o)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	s1, err := m.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.NewSession(); err == nil || !strings.Contains(err.Error(), "KV cache") {
		t.Errorf("second session in a full budget: %v", err)
	}
	s1.Close()
	s2, err := m.NewSession()
	if err != nil {
		t.Fatalf("closing a session did not free its KV cache: %v", err)
	}
	s2.Close()

	for name, oo := range map[string]engine.OffloadOptions{
		"zero budget":     {Policy: offload.OnDemand},
		"negative budget": {Policy: offload.OnDemand, GPUMem: -5},
		"commit guess":    {Policy: offload.Commit, GPUMem: 1 << 40, Predictor: "accuracy=0.9"},
		"prefetch oracle": {Policy: offload.Prefetch, GPUMem: 1 << 40, Predictor: "oracle"},
	} {
		oo := oo
		if _, err := engine.Open(tinyModel, engine.Options{Offload: &oo}); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// TestOffloadStats checks what the offloader reports: the slots are filled when the model
// opens, a budget that holds every expert then copies nothing more, and with fewer slots
// cpu-miss computes misses on the host while filling its slots.
func TestOffloadStats(t *testing.T) {
	prompt := []int32{1, 2, 3, 4, 5, 6, 7, 8}
	probe := offloadProbe(t, tinyModel, engine.Options{ContextLength: 64, Offload: &engine.OffloadOptions{Policy: offload.OnDemand}})
	for _, pol := range []offload.Policy{offload.OnDemand, offload.CPUMiss} {
		for _, all := range []bool{true, false} {
			budget := int64(1 << 40)
			if !all {
				budget = probe.Resident + 6*probe.SlotBytes
			}
			m, err := engine.Open(tinyModel, engine.Options{ContextLength: 64, Offload: &engine.OffloadOptions{Policy: pol, GPUMem: budget}})
			if err != nil {
				t.Fatal(err)
			}
			opened, _ := m.Offload()
			s, _ := m.NewSession()
			for i := 0; i < 2; i++ {
				if err := s.Probs(context.Background(), prompt, func(int, []float32) error { return nil }); err != nil {
					t.Fatal(err)
				}
			}
			st, _ := m.Offload()
			s.Close()
			m.Close()
			if opened.BytesCopied <= 0 || opened.BytesCopied > int64(opened.Slots)*opened.SlotBytes || opened.Hits+opened.Misses != 0 {
				t.Errorf("%s: at open %+v: want the slots filled", pol, opened)
			}
			if all {
				if st.Misses != 0 || st.Hits == 0 || st.BytesCopied != opened.BytesCopied {
					t.Errorf("%s, every expert in a slot: %+v", pol, st)
				}
				continue
			}
			if st.Misses == 0 || st.BytesCopied <= opened.BytesCopied || st.BytesCopied-opened.BytesCopied > st.Misses*st.SlotBytes {
				t.Errorf("%s, 6 slots: %+v", pol, st)
			}
			if pol == offload.CPUMiss && st.OnCPU != st.Misses {
				t.Errorf("cpu-miss: %d of %d misses on the host", st.OnCPU, st.Misses)
			}
			if pol == offload.OnDemand && st.OnCPU != 0 {
				t.Errorf("ondemand computed %d experts on the host", st.OnCPU)
			}
		}
	}
}

// Commit with a heuristic predictor computes with the predicted experts and never falls back:
// its predictions are scored against the router, and where they miss the continuation is not
// the router's (the greedy text of the bundled model departs from ondemand's).
func TestCommitComputesWithPredictions(t *testing.T) {
	gen := func(pol offload.Policy, pred string) ([]int32, engine.OffloadStats) {
		m, err := engine.Open(tinyModel, engine.Options{ContextLength: 128, Offload: &engine.OffloadOptions{Policy: pol, GPUMem: 1 << 40, Predictor: pred}})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		s, _ := m.NewSession()
		defer s.Close()
		ids, _ := m.Tokenize("Prince Andrew looked at Pierre and said", true)
		res, err := s.Generate(context.Background(), ids, engine.GenerateOptions{MaxTokens: 24, IgnoreEOS: true, Sampler: engine.SamplerOptions{Greedy: true}})
		if err != nil {
			t.Fatal(err)
		}
		st, _ := m.Offload()
		return res.Tokens, st
	}
	want, _ := gen(offload.OnDemand, "")
	oracle, _ := gen(offload.Commit, "oracle")
	if !slices.Equal(oracle, want) {
		t.Errorf("commit to the router's own choice: %v, ondemand %v", oracle, want)
	}
	got, st := gen(offload.Commit, "prev-token")
	if st.Predicted == 0 || st.Correct >= st.Predicted {
		t.Errorf("commit with prev-token scored %d of %d predictions right", st.Correct, st.Predicted)
	}
	if slices.Equal(got, want) {
		t.Errorf("commit with %d of %d predictions right decoded exactly ondemand's tokens", st.Correct, st.Predicted)
	}
}

// Without offloading, a simulated GPU holds every weight and each session's KV cache in its
// memory; a card too small for the model is refused at load time, pointing to --gpu-mem.
func TestSimDeviceMemory(t *testing.T) {
	info, err := engine.Inspect(tinyModel)
	if err != nil {
		t.Fatal(err)
	}
	m, err := engine.Open(tinyModel, engine.Options{Device: "sim:rtx2080ti", ContextLength: 64})
	if err != nil {
		t.Fatal(err)
	}
	if m.Device() != "sim:rtx2080ti" {
		t.Errorf("device %q", m.Device())
	}
	// The weights and one pass's activations, which a GPU would hold (TestSimReservesActivations).
	weights := info.NonExpertBytes + info.ExpertBytes
	budget, loaded, _ := m.DeviceMemory()
	if budget != 11811160064 || loaded <= weights || loaded > weights+64<<20 {
		t.Errorf("budget %d, used %d: want the card's 11 GiB, and the %d bytes of weights and the activations", budget, loaded, weights)
	}
	s, err := m.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	_, withKV, _ := m.DeviceMemory()
	s.Close()
	if _, used, peak := m.DeviceMemory(); withKV <= loaded || used != loaded || peak != withKV {
		t.Errorf("a session's KV cache: used %d with it, %d after closing it, peak %d", withKV, used, peak)
	}
	m.Close()

	// A card that holds one pass's activations (8 MB) and a few experts but not every weight.
	small := filepath.Join(t.TempDir(), "small.json")
	card := `{"name": "small", "memory_bytes": 9500000, "memory_bandwidth": 1e11, "peak_flops": 1e13,
		"pcie_bandwidth": 1e10, "pcie_effective": 8e9, "sources": ["a test card"]}`
	if err := os.WriteFile(small, []byte(card), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := engine.Open(tinyModel, engine.Options{Device: "sim:" + small}); err == nil || !strings.Contains(err.Error(), "--gpu-mem") {
		t.Errorf("a 9.5 MB card: %v, want an error pointing to --gpu-mem", err)
	}
	if m, err := engine.Open(tinyModel, engine.Options{Device: "sim:" + small, ContextLength: 64, Offload: &engine.OffloadOptions{GPUMem: 9500000}}); err != nil {
		t.Errorf("the same card with the experts offloaded: %v", err)
	} else {
		m.Close()
	}
}
