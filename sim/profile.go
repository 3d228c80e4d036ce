package sim

import (
	"bytes"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"math"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/commit-run/commit-run/quant"
)

// Profile is the data that describes one GPU to the simulator. All rates are per second and
// all times are seconds.
type Profile struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	// MemoryBytes is the device memory.
	MemoryBytes int64 `json:"memory_bytes"`
	// MemoryBandwidth is the public device-memory bandwidth in bytes/s.
	MemoryBandwidth float64 `json:"memory_bandwidth"`
	// PeakFLOPS is the public dense FP16 tensor-core rate with FP32 accumulate, in FLOP/s.
	// GeForce cards run FP32 accumulate at half their FP16-accumulate rate, and FP32
	// accumulate is what inference kernels use.
	PeakFLOPS float64 `json:"peak_flops"`
	// PCIeBandwidth is the link's theoretical host-to-device rate in bytes/s.
	PCIeBandwidth float64 `json:"pcie_bandwidth"`
	// PCIeEffective is the measured pinned host-to-device rate in bytes/s (bandwidthTest,
	// nvbandwidth). Copies are priced with it, not with PCIeBandwidth.
	PCIeEffective float64 `json:"pcie_effective"`
	// CopyLatency is the fixed cost of one host-to-device copy.
	CopyLatency float64 `json:"copy_latency"`
	// LaunchOverhead is the fixed cost of one kernel.
	LaunchOverhead float64 `json:"launch_overhead"`
	// DecodeBandwidth is, for each weight type it names (quant.Type's name: "Q4_K", "Q8_0",
	// ...), the rate in bytes/s at which the card's products of up to DecodeTokens tokens read
	// weights of that type, as measured (cuda's BenchmarkMMVDecode): what its decode kernels
	// reach, where memory_bandwidth is what its memory could give. Products of a type it does
	// not name, and of more tokens, are priced at memory_bandwidth.
	DecodeBandwidth map[string]float64 `json:"decode_bandwidth,omitempty"`
	// Sources says where each number comes from.
	Sources []string `json:"sources"`
	// Calibrated is false until the profile was compared against a real GPU run.
	Calibrated bool `json:"calibrated"`
}

// Bounds beyond which a number is a typo (a unit slip of 1e3 or more), not a GPU.
const (
	maxMemoryBytes = 16 << 40 // 16 TiB
	maxBandwidth   = 100e12   // 100 TB/s
	maxFLOPS       = 1e18     // 1 EFLOP/s
	maxLatency     = 1.0      // one second per op
)

//go:embed profiles/*.json hosts/*.json
var embedded embed.FS

// Profiles lists the names of the embedded GPU profiles, sorted.
func Profiles() []string { return embeddedNames("profiles") }

// embeddedNames lists the .json files of an embedded directory without the suffix, sorted.
func embeddedNames(dir string) []string {
	// Cannot fail: go:embed refuses to build when the pattern matches nothing.
	entries, _ := fs.ReadDir(embedded, dir)
	var names []string
	for _, e := range entries {
		if n, ok := strings.CutSuffix(e.Name(), ".json"); ok && !e.IsDir() {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	return names
}

// LoadProfile returns a validated profile. A plain name (no path separator, no .json suffix)
// is looked up among the embedded profiles; anything else is read as a JSON file, so users
// can describe their own card.
func LoadProfile(name string) (*Profile, error) {
	return load[Profile](name, "profiles", "GPU profile")
}

// named is a profile of either kind: it names itself and validates.
type named interface {
	name() string
	Validate() error
}

func (p *Profile) name() string { return p.Name }

// load reads the profile called name among the embedded ones of dir, or from a JSON file
// when name is a path; kind names the sort in errors.
func load[T any, P interface {
	*T
	named
}](name, dir, kind string) (*T, error) {
	if isPath(name) {
		data, err := os.ReadFile(name)
		if err != nil {
			return nil, fmt.Errorf("read %s file: %w", kind, err)
		}
		p, err := parse[T, P](data)
		if err != nil {
			return nil, fmt.Errorf("%s file %s: %w", kind, name, err)
		}
		return p, nil
	}
	data, err := embedded.ReadFile(path.Join(dir, name+".json"))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("unknown %s %q (known: %s; or give the path of a .json file)",
				kind, name, strings.Join(embeddedNames(dir), ", "))
		}
		return nil, fmt.Errorf("embedded %s %q: %w", kind, name, err)
	}
	p, err := parse[T, P](data)
	if err != nil {
		return nil, fmt.Errorf("embedded %s %q: %w", kind, name, err)
	}
	if n := P(p).name(); n != name {
		return nil, fmt.Errorf("embedded %s file %s.json names itself %q", kind, name, n)
	}
	return p, nil
}

func isPath(name string) bool {
	return strings.ContainsRune(name, '/') || strings.ContainsRune(name, filepath.Separator) ||
		strings.HasSuffix(name, ".json")
}

// parse decodes exactly one JSON object and validates it. Unknown fields are errors so that
// a misspelt key does not silently leave a rate at zero.
func parse[T any, P interface {
	*T
	named
}](data []byte) (*T, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var p T
	if err := dec.Decode(&p); err != nil {
		return nil, fmt.Errorf("decode JSON: %w", err)
	}
	if err := dec.Decode(&struct{}{}); err != io.EOF {
		return nil, errors.New("decode JSON: trailing data after the profile object")
	}
	if err := P(&p).Validate(); err != nil {
		return nil, err
	}
	return &p, nil
}

// Validate checks that every number is finite, positive (latencies may be zero, for
// ideal-link what-if profiles) and within physical reason. Errors name the profile and the
// field by its JSON key.
func (p *Profile) Validate() error {
	if strings.TrimSpace(p.Name) == "" {
		return errors.New("profile: name is empty")
	}
	fail := func(field string, v any, why string) error {
		return fmt.Errorf("profile %q: %s = %v %s", p.Name, field, v, why)
	}
	if p.MemoryBytes <= 0 {
		return fail("memory_bytes", p.MemoryBytes, "must be positive")
	}
	if p.MemoryBytes > maxMemoryBytes {
		return fail("memory_bytes", p.MemoryBytes, "is more than 16 TiB")
	}
	rates := []struct {
		field string
		v     float64
		max   float64
		unit  string
	}{
		{"memory_bandwidth", p.MemoryBandwidth, maxBandwidth, "100 TB/s"},
		{"peak_flops", p.PeakFLOPS, maxFLOPS, "1e18 FLOP/s"},
		{"pcie_bandwidth", p.PCIeBandwidth, maxBandwidth, "100 TB/s"},
		{"pcie_effective", p.PCIeEffective, maxBandwidth, "100 TB/s"},
	}
	for _, r := range rates {
		if math.IsNaN(r.v) || math.IsInf(r.v, 0) {
			return fail(r.field, r.v, "must be finite")
		}
		if r.v <= 0 {
			return fail(r.field, r.v, "must be positive")
		}
		if r.v > r.max {
			return fail(r.field, r.v, "is more than "+r.unit)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(p.DecodeBandwidth)) {
		field, v := "decode_bandwidth."+name, p.DecodeBandwidth[name]
		switch {
		case !weightTypes[name]:
			return fail(field, v, "names no weight type (Q4_K, Q8_0, F16, ...)")
		case math.IsNaN(v) || math.IsInf(v, 0):
			return fail(field, v, "must be finite")
		case v <= 0:
			return fail(field, v, "must be positive")
		case v > p.MemoryBandwidth:
			return fail(field, v, fmt.Sprintf("exceeds memory_bandwidth %v: a kernel cannot read faster than the memory", p.MemoryBandwidth))
		}
	}
	if p.PCIeEffective > p.PCIeBandwidth {
		return fail("pcie_effective", p.PCIeEffective,
			fmt.Sprintf("exceeds pcie_bandwidth %v: a measured rate cannot beat the link", p.PCIeBandwidth))
	}
	for _, l := range []struct {
		field string
		v     float64
	}{{"copy_latency", p.CopyLatency}, {"launch_overhead", p.LaunchOverhead}} {
		if math.IsNaN(l.v) || math.IsInf(l.v, 0) {
			return fail(l.field, l.v, "must be finite")
		}
		if l.v < 0 {
			return fail(l.field, l.v, "must not be negative")
		}
		if l.v > maxLatency {
			return fail(l.field, l.v, "is more than one second")
		}
	}
	return nil
}

// KernelTime is the roofline time of one kernel that moves bytes through device memory and
// performs flops: whichever limit binds, plus the launch overhead.
func (p *Profile) KernelTime(bytes, flops float64) float64 {
	return p.roofline(bytes, flops, p.MemoryBandwidth)
}

// roofline is a kernel's time with its bytes moved at bw.
func (p *Profile) roofline(bytes, flops, bw float64) float64 {
	return max(bytes/bw, flops/p.PeakFLOPS) + p.LaunchOverhead
}

// DecodeTokens is the most tokens of a product that DecodeBandwidth prices: the CUDA engine's
// matrix-vector kernels take up to 8 tokens a pass, more go to its tiled kernels.
const DecodeTokens = 8

// ProductTime is KernelTime for a matrix product of T tokens with weights of type t that
// moves bytes and performs flops: its weights read at the card's measured decode rate for t
// where the profile has one and T is at most DecodeTokens.
func (p *Profile) ProductTime(t quant.Type, T int, bytes, flops float64) float64 {
	if bw, ok := p.DecodeBandwidth[t.String()]; ok && T <= DecodeTokens {
		return p.roofline(bytes, flops, bw)
	}
	return p.KernelTime(bytes, flops)
}

// weightTypes are the names of the weight types, which DecodeBandwidth may name.
var weightTypes = func() map[string]bool {
	m := map[string]bool{}
	for t := quant.Type(0); t < 256; t++ {
		if t.Weight() {
			m[t.String()] = true
		}
	}
	return m
}()

// CopyTime is the time of one pinned host-to-device copy of bytes.
func (p *Profile) CopyTime(bytes float64) float64 {
	return bytes/p.PCIeEffective + p.CopyLatency
}
