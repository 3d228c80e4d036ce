package engine_test

import (
	"slices"
	"testing"

	"github.com/commit-run/commit-run/engine"
)

// TestCUDAPrefillMMQ prefills a prompt of more tokens than mmv takes in one pass on cuda:0 of
// the fake driver (or -gpu=system): the batched products (cuda/kernels/mmq.cu) run, and the GPU
// still gives the CPU's greedy tokens and its next-token probabilities within 2e-3, as in
// TestCUDAFakeDriver.
func TestCUDAPrefillMMQ(t *testing.T) {
	lib := engine.GPUForTests(t)
	for _, path := range []string{bundledQwen, bundledMixtral} {
		m, err := engine.Open(path, engine.Options{Threads: 2})
		if err != nil {
			t.Fatal(err)
		}
		prompt, err := m.Tokenize("The old prince said that he would not go to the war, and Pierre looked at him with a smile.", true)
		m.Close()
		if err != nil {
			t.Fatal(err)
		}
		if len(prompt) < 17 {
			t.Fatalf("%s: the prompt is %d tokens, want at least 17 (two of mmv's passes)", path, len(prompt))
		}
		base := engine.Options{Threads: 2, KVType: "f32", ContextLength: 64}
		want := runOn(t, path, base, prompt, 4)
		o := base
		o.Device, o.CUDALibrary = "cuda:0", lib
		got := runOn(t, path, o, prompt, 4)
		if !slices.Equal(got.tokens, want.tokens) {
			t.Errorf("%s: greedy on the GPU %v, on the CPU %v", path, got.tokens, want.tokens)
		}
		if d := maxDiff(got.probs, want.probs); d > 2e-3 {
			t.Errorf("%s: probabilities differ from the CPU's by up to %g", path, d)
		}
		if got.gpu.MMQLaunches == 0 || got.gpu.HostFallbacks != 0 {
			t.Errorf("%s: %+v: want the prefill's products on mmq, all on the GPU", path, got.gpu)
		}
	}
}
