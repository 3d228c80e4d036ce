package sim

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/commit-run/commit-run/device"
)

func TestEmbeddedHosts(t *testing.T) {
	names := Hosts()
	for _, want := range []string{"i9-10900x", "xeon-e5-2680v4", "xeon-w5-3435x"} {
		if !contains(names, want) {
			t.Errorf("Hosts() = %v, missing %q", names, want)
		}
	}
	for _, n := range names {
		t.Run(n, func(t *testing.T) {
			h, err := LoadHost(n)
			if err != nil {
				t.Fatal(err)
			}
			if h.Name != n || h.Description == "" {
				t.Errorf("name %q (want %q), description %q", h.Name, n, h.Description)
			}
			for _, field := range []string{"threads", "memory_bandwidth", "expert_bandwidth", "expert_flops", "kernel_overhead"} {
				found := false
				for _, s := range h.Sources {
					found = found || strings.HasPrefix(s, field+":")
				}
				if !found {
					t.Errorf("no source for %s", field)
				}
			}
			// Calibrated says a number was set from a published figure: the sources must say
			// which, and nothing else may claim it.
			set := false
			for _, s := range h.Sources {
				set = set || strings.Contains(s, "SET FROM THE CALIBRATION POINT")
			}
			if set != h.Calibrated {
				t.Errorf("calibrated %v, but a source says a number was set from the calibration point: %v", h.Calibrated, set)
			}
			r, err := h.Rates().WithDefaults()
			if err != nil {
				t.Fatal(err)
			}
			if want := (device.HostRates{Bandwidth: h.ExpertBandwidth, FLOPS: h.ExpertFLOPS, Overhead: h.KernelOverhead, Memory: h.MemoryBandwidth}); r != want {
				t.Errorf("rates %+v, want %+v", r, want)
			}
		})
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func writeHost(t *testing.T, dir, name string, mutate func(m map[string]any)) string {
	t.Helper()
	return writeJSON(t, dir, name, map[string]any{
		"name": "mine", "description": "my desktop", "threads": 8,
		"memory_bandwidth": 60e9, "expert_bandwidth": 40e9, "expert_flops": 300e9, "kernel_overhead": 1e-5,
		"sources": []string{"my own STREAM run"}, "calibrated": false,
	}, mutate)
}

func TestLoadHostUserFile(t *testing.T) {
	h, err := LoadHost(writeHost(t, t.TempDir(), "mine.json", nil))
	if err != nil {
		t.Fatal(err)
	}
	if h.Name != "mine" || h.Threads != 8 || h.ExpertBandwidth != 40e9 {
		t.Errorf("loaded %+v", h)
	}
}

func TestLoadHostBadInput(t *testing.T) {
	dir := t.TempDir()
	set := func(k string, v any) func(map[string]any) { return func(m map[string]any) { m[k] = v } }
	cases := []struct {
		name   string
		mutate func(map[string]any)
		want   string
	}{
		{"zero threads", set("threads", 0), "threads"},
		{"absurd threads", set("threads", 1<<20), "threads"},
		{"negative memory", set("memory_bandwidth", -1), "memory_bandwidth"},
		{"missing expert rate", func(m map[string]any) { delete(m, "expert_bandwidth") }, "expert_bandwidth"},
		{"kernels beat the memory", set("expert_bandwidth", 70e9), "expert_bandwidth"},
		{"absurd flops", set("expert_flops", 1e19), "expert_flops"},
		{"NaN as a string", set("expert_flops", "NaN"), "expert_flops"},
		{"absurd overhead", set("kernel_overhead", 3.0), "kernel_overhead"},
		{"empty name", set("name", " "), "name is empty"},
		{"misspelt key", set("expert_bandwith", 1e9), "expert_bandwith"},
		{"a GPU profile", set("pcie_effective", 1e9), "pcie_effective"},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := writeHost(t, dir, fmt.Sprintf("case%d.json", i), c.mutate)
			_, err := LoadHost(path)
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), path) {
				t.Errorf("error %v, want one naming %s and %q", err, path, c.want)
			}
		})
	}
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"name": "x", `), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadHost(bad); err == nil || !strings.Contains(err.Error(), "decode JSON") {
		t.Errorf("truncated JSON: %v", err)
	}
	_, err := LoadHost("pentium-ii")
	if err == nil || !strings.Contains(err.Error(), "unknown host profile \"pentium-ii\"") || !strings.Contains(err.Error(), "i9-10900x") {
		t.Errorf("unknown name: %v", err)
	}
}

// FuzzParseProfiles: neither parser panics, and what either accepts validates.
func FuzzParseProfiles(f *testing.F) {
	for _, dir := range []string{"profiles", "hosts"} {
		for _, n := range embeddedNames(dir) {
			data, err := embedded.ReadFile(dir + "/" + n + ".json")
			if err != nil {
				f.Fatal(err)
			}
			f.Add(data)
		}
	}
	f.Add([]byte(`{"name":"x","threads":-1}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		if p, err := parse[Profile](data); err == nil {
			if err := p.Validate(); err != nil {
				t.Fatalf("accepted an invalid GPU profile: %v", err)
			}
		}
		if h, err := parse[HostProfile](data); err == nil {
			if err := h.Validate(); err != nil {
				t.Fatalf("accepted an invalid host profile: %v", err)
			}
			if _, err := h.Rates().WithDefaults(); err != nil {
				t.Fatalf("a valid host profile's rates are refused: %v", err)
			}
		}
	})
}
