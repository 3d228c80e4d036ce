package main

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/commit-run/commit-run/synth"
)

var errTest = errors.New("test failure")

func TestParseTests(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []test
		err  string
	}{
		{in: "pp512", want: []test{{Prefill: true, N: 512}}},
		{in: "tg64", want: []test{{N: 64}}},
		{in: "tg64@d2048", want: []test{{N: 64, Depth: 2048}}},
		{in: " pp128 , tg64,pp128", want: []test{{Prefill: true, N: 128}, {N: 64}}},
		{in: "tg8@d0", want: []test{{N: 8}}},
		{in: "", err: "no tests"},
		{in: "pp", err: "want ppN"},
		{in: "pp0", err: "want ppN"},
		{in: "tg-3", err: "want ppN"},
		{in: "tg64@2048", err: "want ppN"},
		{in: "tg64@d", err: "want ppN"},
		{in: "xx64", err: "want ppN"},
		{in: "pp99999999", err: "want ppN"},
	} {
		got, err := parseTests(c.in)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("parseTests(%q) = %v, %v; want an error with %q", c.in, got, err, c.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("parseTests(%q) = %v, %v; want %v", c.in, got, err, c.want)
		}
	}
}

func TestTestString(t *testing.T) {
	for _, s := range []string{"pp512", "tg64", "tg64@d2048"} {
		x, err := parseTest(s)
		if err != nil || x.String() != s {
			t.Errorf("parseTest(%q).String() = %q, %v", s, x.String(), err)
		}
	}
}

func TestPlan(t *testing.T) {
	tests, err := parseTests(defaultTests)
	if err != nil {
		t.Fatal(err)
	}
	got := plan(tests)
	want := []runSpec{
		{Prompt: 128, Yields: []test{{Prefill: true, N: 128}}},
		{Prompt: 512, Yields: []test{{Prefill: true, N: 512}}},
		{Prompt: 1, Decode: 64, Yields: []test{{N: 64}}},
		{Prompt: 2048, Decode: 64, Yields: []test{{N: 64, Depth: 2048}, {Prefill: true, N: 2048}}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("plan(%s) = %+v\nwant %+v", defaultTests, got, want)
	}
	// Two decode tests at one depth: only the first also yields the prompt test.
	tests, _ = parseTests("tg8@d16,tg4@d16,pp16")
	got = plan(tests)
	if len(got) != 2 || len(got[0].Yields) != 2 || len(got[1].Yields) != 1 {
		t.Errorf("plan(tg8@d16,tg4@d16,pp16) = %+v", got)
	}
}

func TestPick(t *testing.T) {
	s, err := parseShapes("qwen3-30b-a3b,olmoe")
	if err != nil || len(s) != 2 || s[0].Name != "qwen3moe" || s[1].Name != "olmoe" {
		t.Errorf("parseShapes by label and name = %v, %v", s, err)
	}
	if s, err := parseShapes("all"); err != nil || len(s) != len(shapes) {
		t.Errorf("parseShapes(all) = %v, %v", s, err)
	}
	ty, err := parseTypes("Q4_0,q4km")
	if err != nil || len(ty) != 2 || ty[0].Recipe != "q4_0-preset" || ty[1].Label != "Q4_K_M" {
		t.Errorf("parseTypes(Q4_0,q4km) = %v, %v", ty, err)
	}
	if _, err := parseTypes("q5km"); err == nil || !strings.Contains(err.Error(), "have q4km, q8_0, q4_0-preset") {
		t.Errorf("parseTypes(q5km) error = %v", err)
	}
	if _, err := parseShapes(","); err == nil {
		t.Error("parseShapes(\",\") gave no error")
	}
}

func TestParseThreads(t *testing.T) {
	if got, err := parseThreads("0,1, 4", 16); err != nil || !reflect.DeepEqual(got, []int{16, 1, 4}) {
		t.Errorf("parseThreads = %v, %v", got, err)
	}
	for _, bad := range []string{"", "x", "-1", "1,,x"} {
		if _, err := parseThreads(bad, 2); err == nil {
			t.Errorf("parseThreads(%q) gave no error", bad)
		}
	}
}

// TestQwen3Attention checks that the Qwen3 shape has the real model's attention: 32 query
// heads of 128 (4096 wide from d_model 2048) and 4 KV heads.
func TestQwen3Attention(t *testing.T) {
	sh, _ := parseShapes("qwen3moe")
	spec, err := benchSpec(sh[0], wtypes[1], 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	m, err := synth.Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]uint64{
		"blk.0.attn_q.weight":        {2048, 4096},
		"blk.0.attn_k.weight":        {2048, 512},
		"blk.0.attn_v.weight":        {2048, 512},
		"blk.0.attn_output.weight":   {4096, 2048},
		"blk.0.attn_q_norm.weight":   {128},
		"blk.0.ffn_gate_exps.weight": {2048, 768, 128},
		"blk.0.ffn_down_exps.weight": {768, 2048, 128},
		"output.weight":              {2048, 151936},
	}
	for _, ts := range m.Tensors {
		if w, ok := want[ts.Name]; ok {
			if !reflect.DeepEqual(ts.Shape, w) {
				t.Errorf("%s: shape %v, want %v", ts.Name, ts.Shape, w)
			}
			delete(want, ts.Name)
		}
	}
	if len(want) > 0 {
		t.Errorf("missing tensors %v", want)
	}
	if k := m.KV["qwen3moe.attention.key_length"]; k != uint32(128) {
		t.Errorf("key_length %v, want 128", k)
	}
}

// TestDefaultLayers pins the automatic layer counts of the default files and checks each is
// the most that stays under 2 GB.
func TestDefaultLayers(t *testing.T) {
	want := map[string]int{
		"olmoe/q4km": 7, "olmoe/q8_0": 3, "olmoe/q4_0-preset": 7,
		"qwen3moe/q4km": 4, "qwen3moe/q8_0": 2, "qwen3moe/q4_0-preset": 4,
		"gptoss/mxfp4": 1, "qwen36/q4km": 2,
	}
	const limit = 2e9
	for _, sh := range shapes {
		for _, ty := range wtypes {
			if !sh.takes(ty) {
				continue
			}
			l, est, err := chooseLayers(sh, ty, limit, 1)
			if err != nil {
				t.Fatal(err)
			}
			if key := sh.Name + "/" + ty.Recipe; l != want[key] {
				t.Errorf("%s: %d layers, want %d", key, l, want[key])
			}
			if est >= limit {
				t.Errorf("%s %s: %d layers estimated at %d bytes, over the limit", sh.Name, ty.Recipe, l, est)
			}
			next, err := benchSpec(sh, ty, l+1, 1)
			if err != nil {
				t.Fatal(err)
			}
			if n, _ := estimateBytes(next); n < limit {
				t.Errorf("%s %s: %d layers would fit too (%d bytes)", sh.Name, ty.Recipe, l+1, n)
			}
		}
	}
}
