package offload

import (
	"strings"
	"testing"

	"github.com/commit-run/commit-run/quant"
)

func TestPublicShapes(t *testing.T) {
	// Mixtral-8x7B at Q4_K: one expert is 3 x 4096 x 14336 weights at 4.5 bits = 99.1 MB,
	// and 32 layers x 8 experts hold 25.4 GB: the reason it needs offloading on a 24 GB card.
	s, err := PublicShape("mixtral-8x7b@q4_k", 0, 512)
	if err != nil {
		t.Fatal(err)
	}
	if want := 3 * 4096 * 14336 * 144.0 / 256; s.ExpertBytes != want {
		t.Errorf("expert bytes %v, want %v", s.ExpertBytes, want)
	}
	if total := s.ExpertBytes * 8 * 32; total < 25e9 || total > 26e9 {
		t.Errorf("expert total %.3g bytes", total)
	}
	// Non-expert weights of Mixtral are ~1.6B parameters; at Q4_K about 0.9 GB plus the cache.
	if s.Resident < 0.8e9 || s.Resident > 1.2e9 {
		t.Errorf("resident %.3g bytes", s.Resident)
	}
	for _, n := range PublicShapes() {
		for _, typ := range []quant.Type{quant.Q4_K, quant.Q8_0, quant.F16} {
			s, err := PublicShape(n, typ, 1024)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Validate(); err != nil {
				t.Error(err)
			}
		}
	}
	ds, _ := PublicShape("deepseek-v2-lite", quant.Q4_K, 512)
	if ds.DenseLayers != 1 || ds.MoELayers != 26 || ds.Shared.Bytes == 0 {
		t.Errorf("deepseek-v2-lite: %+v", ds)
	}
	for _, bad := range []string{"gpt-5", "mixtral-8x7b@q9", "mixtral-8x7b@i32"} {
		if _, err := PublicShape(bad, quant.Q4_K, 512); err == nil {
			t.Errorf("%s: no error", bad)
		} else if bad == "gpt-5" && !strings.Contains(err.Error(), "mixtral-8x7b") {
			t.Errorf("unknown shape error does not list the known ones: %v", err)
		}
	}
	if _, err := PublicShape("olmoe-1b-7b", quant.Q4_K, 0); err == nil {
		t.Error("context 0: no error")
	}
}
