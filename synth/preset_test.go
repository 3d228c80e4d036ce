package synth

import (
	"encoding/json"
	"os"
	"sort"
	"testing"
)

// TestQ4KMIsLlamaCpps builds every shape in testdata/q4km-llamacpp.json with Q4KM and
// requires the type llama.cpp's own quantizer gave each of its tensors under its Q4_K_M
// preset (go run ./tools/golden/cmd/presets writes the file): the public shapes' "q4km"
// files hold the published files' bytes, tensor for tensor.
func TestQ4KMIsLlamaCpps(t *testing.T) {
	b, err := os.ReadFile("testdata/q4km-llamacpp.json")
	if err != nil {
		t.Fatal(err)
	}
	var rec struct {
		Shapes []struct {
			Shape string
			Small struct{ Embd, Heads, HeadsKV, Experts, ExpertsUsed, FFN, ExpertFFN, Vocab int }
			Types map[string]string
		}
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		t.Fatal(err)
	}
	if len(rec.Shapes) < 10 {
		t.Fatalf("%d shapes in the record, want 10", len(rec.Shapes))
	}
	for _, sh := range rec.Shapes {
		t.Run(sh.Shape, func(t *testing.T) {
			sm := sh.Small
			s, err := BenchShape(sh.Shape, BenchOptions{Embd: sm.Embd, Heads: sm.Heads, HeadsKV: sm.HeadsKV, Experts: sm.Experts,
				ExpertsUsed: sm.ExpertsUsed, FFN: sm.FFN, ExpertFFN: sm.ExpertFFN, Vocab: sm.Vocab, Types: Q4KM})
			if err != nil {
				t.Fatal(err)
			}
			m, err := Build(s)
			if err != nil {
				t.Fatal(err)
			}
			seen, bad := map[string]bool{}, []string{}
			for _, ten := range m.Tensors {
				seen[ten.Name] = true
				if want, ok := sh.Types[ten.Name]; !ok {
					bad = append(bad, ten.Name+": not in llama.cpp's file")
				} else if got := ten.Type.String(); got != want {
					bad = append(bad, ten.Name+": "+got+", llama.cpp "+want)
				}
			}
			for name := range sh.Types {
				if !seen[name] {
					bad = append(bad, name+": only in llama.cpp's file")
				}
			}
			sort.Strings(bad)
			for i, e := range bad {
				if i == 10 {
					t.Errorf("... %d more", len(bad)-10)
					break
				}
				t.Error(e)
			}
		})
	}
}
