package sim

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/commit-run/commit-run/quant"
)

// testProfile has round numbers so that costs can be worked out by hand.
func testProfile() *Profile {
	return &Profile{
		Name:            "test",
		MemoryBytes:     1 << 30,
		MemoryBandwidth: 100e9, // 100 GB/s
		PeakFLOPS:       10e12, // 10 TFLOP/s
		PCIeBandwidth:   16e9,
		PCIeEffective:   10e9, // 10 GB/s
		CopyLatency:     10e-6,
		LaunchOverhead:  5e-6,
	}
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-12*math.Max(math.Abs(a), math.Abs(b)) }

func TestKernelTime(t *testing.T) {
	p := testProfile()
	cases := []struct {
		name         string
		bytes, flops float64
		want         float64
	}{
		// 200 MB / 100 GB/s = 2 ms beats 1 GFLOP / 10 TFLOP/s = 0.1 ms.
		{"memory-bound", 200e6, 1e9, 2e-3 + 5e-6},
		// 1 MB / 100 GB/s = 10 µs loses to 50 GFLOP / 10 TFLOP/s = 5 ms.
		{"compute-bound", 1e6, 50e9, 5e-3 + 5e-6},
		// Exactly balanced: 1 GB and 100 GFLOP both take 10 ms.
		{"balanced", 1e9, 100e9, 10e-3 + 5e-6},
		{"empty kernel costs the launch", 0, 0, 5e-6},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := p.KernelTime(c.bytes, c.flops); !near(got, c.want) {
				t.Errorf("KernelTime(%g, %g) = %g, want %g", c.bytes, c.flops, got, c.want)
			}
		})
	}
}

func TestProductTime(t *testing.T) {
	p := testProfile()
	p.DecodeBandwidth = map[string]float64{"Q4_K": 40e9} // 40% of the 100 GB/s
	cases := []struct {
		name         string
		typ          quant.Type
		T            int
		bytes, flops float64
		want         float64
	}{
		// 4 MB at Q4_K's 40 GB/s: 100 us, where the memory's rate would give 40.
		{"decode at the type's rate", quant.Q4_K, 1, 4e6, 8e6, 100e-6 + 5e-6},
		{"the most tokens of a decode product", quant.Q4_K, DecodeTokens, 4e6, 64e6, 100e-6 + 5e-6},
		// A prompt's product runs on other kernels: the roofline at the memory's rate.
		{"a prompt's product", quant.Q4_K, DecodeTokens + 1, 4e6, 72e6, 40e-6 + 5e-6},
		{"a type the profile does not name", quant.Q8_0, 1, 4e6, 8e6, 40e-6 + 5e-6},
		// Compute still binds where it is the longer: 5 GFLOP at 10 TFLOP/s.
		{"compute-bound", quant.Q4_K, 1, 4e6, 5e9, 500e-6 + 5e-6},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := p.ProductTime(c.typ, c.T, c.bytes, c.flops); !near(got, c.want) {
				t.Errorf("ProductTime(%v, %d, %g, %g) = %g, want %g", c.typ, c.T, c.bytes, c.flops, got, c.want)
			}
		})
	}
}

func TestCopyTime(t *testing.T) {
	p := testProfile()
	cases := []struct {
		bytes, want float64
	}{
		{0, 10e-6},
		{10e6, 1e-3 + 10e-6},     // 10 MB at 10 GB/s
		{176e6, 17.6e-3 + 10e-6}, // one Mixtral expert at 8 bits (176 M weights)
	}
	for _, c := range cases {
		if got := p.CopyTime(c.bytes); !near(got, c.want) {
			t.Errorf("CopyTime(%g) = %g, want %g", c.bytes, got, c.want)
		}
	}
	// Copies use the measured rate, not the theoretical link rate.
	if p.CopyTime(16e9) < 1.5 {
		t.Errorf("CopyTime(16 GB) = %g s: priced at pcie_bandwidth instead of pcie_effective", p.CopyTime(16e9))
	}
}

func TestEmbeddedProfiles(t *testing.T) {
	names := Profiles()
	for _, want := range []string{"h100-pcie", "rtx2080", "rtx2080ti", "rtx4090"} {
		found := false
		for _, n := range names {
			found = found || n == want
		}
		if !found {
			t.Errorf("Profiles() = %v, missing %q", names, want)
		}
	}
	for i := 1; i < len(names); i++ {
		if names[i-1] >= names[i] {
			t.Errorf("Profiles() not sorted: %v", names)
		}
	}
	for _, n := range names {
		t.Run(n, func(t *testing.T) {
			p, err := LoadProfile(n)
			if err != nil {
				t.Fatal(err)
			}
			if p.Name != n {
				t.Errorf("name %q, want %q", p.Name, n)
			}
			if err := p.Validate(); err != nil {
				t.Error(err)
			}
			if p.Description == "" {
				t.Error("no description")
			}
			if p.Calibrated {
				t.Error("calibrated is true, but no profile has been compared against a real GPU yet")
			}
			// Every number needs a source line that names its field.
			for _, field := range []string{"memory_bytes", "memory_bandwidth", "peak_flops", "pcie_bandwidth",
				"pcie_effective", "copy_latency", "launch_overhead"} {
				ok := false
				for _, s := range p.Sources {
					ok = ok || strings.HasPrefix(s, field+":")
				}
				if !ok {
					t.Errorf("no source for %s", field)
				}
			}
			if p.PCIeEffective >= p.PCIeBandwidth {
				t.Errorf("pcie_effective %g is not below the theoretical %g", p.PCIeEffective, p.PCIeBandwidth)
			}
		})
	}
}

// The headline numbers of DESIGN.md §4, so that an edit of the data files is deliberate.
func TestEmbeddedProfileNumbers(t *testing.T) {
	const GiB = 1 << 30
	cases := []struct {
		name             string
		memory           int64
		bandwidth, pcieT float64
	}{
		{"rtx4090", 24 * GiB, 1008e9, 31.5e9},
		{"rtx2080ti", 11 * GiB, 616e9, 15.75e9},
		{"rtx2080", 8 * GiB, 448e9, 15.75e9},
		{"h100-pcie", 80 * GiB, 2000e9, 63e9},
	}
	for _, c := range cases {
		p, err := LoadProfile(c.name)
		if err != nil {
			t.Fatal(err)
		}
		if p.MemoryBytes != c.memory || p.MemoryBandwidth != c.bandwidth || p.PCIeBandwidth != c.pcieT {
			t.Errorf("%s: memory %d, bandwidth %g, pcie %g; want %d, %g, %g",
				c.name, p.MemoryBytes, p.MemoryBandwidth, p.PCIeBandwidth, c.memory, c.bandwidth, c.pcieT)
		}
	}
}

func TestLoadProfileUnknownName(t *testing.T) {
	_, err := LoadProfile("rtx9090")
	if err == nil {
		t.Fatal("no error for an unknown profile")
	}
	for _, want := range append([]string{"rtx9090"}, Profiles()...) {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

func writeProfile(t *testing.T, dir, name string, mutate func(m map[string]any)) string {
	t.Helper()
	return writeJSON(t, dir, name, map[string]any{
		"name": "mine", "description": "a card of my own",
		"memory_bytes": 8 << 30, "memory_bandwidth": 448e9, "peak_flops": 40e12,
		"pcie_bandwidth": 15.75e9, "pcie_effective": 12e9,
		"copy_latency": 1e-5, "launch_overhead": 4e-6,
		"sources": []string{"my own bandwidthTest"}, "calibrated": true,
	}, mutate)
}

// writeJSON writes m, changed by mutate, as the JSON file dir/name.
func writeJSON(t *testing.T, dir, name string, m map[string]any, mutate func(m map[string]any)) string {
	t.Helper()
	if mutate != nil {
		mutate(m)
	}
	data, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestLoadProfileUserFile(t *testing.T) {
	path := writeProfile(t, t.TempDir(), "mine.json", nil)
	p, err := LoadProfile(path)
	if err != nil {
		t.Fatal(err)
	}
	if p.Name != "mine" || p.MemoryBytes != 8<<30 || p.PCIeEffective != 12e9 || !p.Calibrated {
		t.Errorf("loaded %+v", p)
	}
	// A relative path without a slash is still a file when it ends in .json.
	t.Chdir(filepath.Dir(path))
	if _, err := LoadProfile("mine.json"); err != nil {
		t.Errorf("relative .json path: %v", err)
	}
}

func TestLoadProfileBadFiles(t *testing.T) {
	dir := t.TempDir()
	set := func(k string, v any) func(map[string]any) { return func(m map[string]any) { m[k] = v } }
	cases := []struct {
		name   string
		mutate func(map[string]any)
		want   string
	}{
		{"negative bandwidth", set("memory_bandwidth", -1e9), "memory_bandwidth"},
		{"zero flops", set("peak_flops", 0), "peak_flops"},
		{"missing field", func(m map[string]any) { delete(m, "pcie_effective") }, "pcie_effective"},
		{"NaN as a string", set("pcie_effective", "NaN"), "pcie_effective"},
		{"overflowing number", set("peak_flops", json.RawMessage("1e400")), "peak_flops"},
		{"absurd memory", set("memory_bytes", int64(1)<<50), "memory_bytes"},
		{"fractional memory", set("memory_bytes", 24e9+0.5), "memory_bytes"},
		{"absurd bandwidth", set("memory_bandwidth", 1e15), "memory_bandwidth"},
		{"absurd flops", set("peak_flops", 1e19), "peak_flops"},
		{"effective beats link", set("pcie_effective", 20e9), "pcie_effective"},
		{"negative latency", set("copy_latency", -1e-6), "copy_latency"},
		{"absurd launch overhead", set("launch_overhead", 5.0), "launch_overhead"},
		{"empty name", set("name", ""), "name is empty"},
		{"misspelt key", set("pcie_efective", 1e9), "pcie_efective"},
		{"decode rate of no weight type", set("decode_bandwidth", map[string]any{"Q4_KM": 1e9}), "decode_bandwidth.Q4_KM"},
		{"decode rate above the memory's", set("decode_bandwidth", map[string]any{"Q4_K": 1e15}), "decode_bandwidth.Q4_K"},
		{"zero decode rate", set("decode_bandwidth", map[string]any{"Q8_0": 0}), "decode_bandwidth.Q8_0"},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// File names that cannot contain the field names the errors must mention.
			path := writeProfile(t, dir, fmt.Sprintf("case%d.json", i), c.mutate)
			_, err := LoadProfile(path)
			if err == nil {
				t.Fatal("no error")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not name %q", err, c.want)
			}
			if !strings.Contains(err.Error(), path) {
				t.Errorf("error %q does not name the file", err)
			}
		})
	}

	raw := []struct{ name, content, want string }{
		{"bad.json", `{"name": "x", `, "decode JSON"},
		{"two.json", `{"name":"mine"} {"name":"again"}`, "trailing data"},
	}
	for _, c := range raw {
		path := filepath.Join(dir, c.name)
		if err := os.WriteFile(path, []byte(c.content), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := LoadProfile(path)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: error %v, want one naming the file and %q", c.name, err, c.want)
		}
	}

	missing := filepath.Join(dir, "nope.json")
	_, err := LoadProfile(missing)
	if err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("missing file: error %v, want one naming %s", err, missing)
	}
}

func TestValidateNamesProfile(t *testing.T) {
	p := testProfile()
	p.PCIeEffective = math.Inf(1)
	err := p.Validate()
	if err == nil || !strings.Contains(err.Error(), `"test"`) || !strings.Contains(err.Error(), "pcie_effective") {
		t.Errorf("Validate() = %v, want an error naming profile \"test\" and pcie_effective", err)
	}
	p = testProfile()
	p.MemoryBandwidth = math.NaN()
	if err := p.Validate(); err == nil || !strings.Contains(err.Error(), "finite") {
		t.Errorf("Validate() with NaN = %v, want a 'finite' error", err)
	}
	if err := testProfile().Validate(); err != nil {
		t.Errorf("valid profile: %v", err)
	}
}
