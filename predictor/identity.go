package predictor

import (
	"fmt"
	"slices"
	"strings"

	"github.com/commit-run/commit-run/trace"
)

// Identity names the model a Router was trained for.
type Identity struct {
	Model       string // general.name
	Arch        string
	Fingerprint string // 64 hex digits, computed by the engine; "" only in tests/synthetic traces
	Layers      int
	MoELayers   []int
	Experts     int
	Used        int
	Embd        int
}

// IdentityOf is the identity of the model a trace was recorded from.
func IdentityOf(h trace.Header) Identity {
	return Identity{
		Model: h.Model, Arch: h.Arch, Fingerprint: h.Fingerprint, Layers: h.Layers,
		MoELayers: slices.Clone(h.MoELayers), Experts: h.Experts, Used: h.Used, Embd: h.Embd,
	}
}

// Check returns nil when other describes the same model as id, else an error naming each
// field that differs.
//
// The fingerprint is the authority when both sides have one: it hashes what the router sees
// (token embedding and routers), so a renamed copy of a model still matches and a fine-tune
// under the old name does not; the names are then not compared. When either side lacks a
// fingerprint (a synthetic trace, a test) the model names stand in for it. The shapes are
// always compared, since a Router of another shape cannot even run.
func (id Identity) Check(other Identity) error {
	var diffs []string
	if id.Fingerprint != "" && other.Fingerprint != "" {
		if id.Fingerprint != other.Fingerprint {
			diffs = append(diffs, fmt.Sprintf("fingerprint %s != %s", short(id.Fingerprint), short(other.Fingerprint)))
		}
	} else if id.Model != other.Model {
		diffs = append(diffs, fmt.Sprintf("model %q != %q", id.Model, other.Model))
	}
	if id.Arch != other.Arch {
		diffs = append(diffs, fmt.Sprintf("arch %s != %s", id.Arch, other.Arch))
	}
	diffs = append(diffs, id.shapeDiffs(other)...)
	if len(diffs) == 0 {
		return nil
	}
	return fmt.Errorf("predictor trained for %s cannot serve %s: %s", id.describe(), other.describe(), strings.Join(diffs, ", "))
}

// CheckShape is Check for the routing shape alone: what a dataset must have for a router to
// be trained or scored on it. Which model a trace came from is its reader's business (the
// engine checks traces against the model it has open), and a trace without a fingerprint
// may name the model differently.
func (id Identity) CheckShape(other Identity) error {
	if diffs := id.shapeDiffs(other); len(diffs) > 0 {
		return fmt.Errorf("router for %s, trace of %s: %s", id.describe(), other.describe(), strings.Join(diffs, ", "))
	}
	return nil
}

func (id Identity) shapeDiffs(other Identity) []string {
	var diffs []string
	add := func(format string, a ...any) { diffs = append(diffs, fmt.Sprintf(format, a...)) }
	if id.Layers != other.Layers {
		add("layers %d != %d", id.Layers, other.Layers)
	}
	if !slices.Equal(id.MoELayers, other.MoELayers) {
		add("moe layers %v != %v", id.MoELayers, other.MoELayers)
	}
	if id.Experts != other.Experts {
		add("experts %d != %d", id.Experts, other.Experts)
	}
	if id.Used != other.Used {
		add("used %d != %d", id.Used, other.Used)
	}
	if id.Embd != other.Embd {
		add("embd %d != %d", id.Embd, other.Embd)
	}
	return diffs
}

// describe is the one-line name of a model in messages: `"name" (arch, fingerprint 1a2b3c4d…)`.
func (id Identity) describe() string {
	fp := "no fingerprint"
	if id.Fingerprint != "" {
		fp = "fingerprint " + short(id.Fingerprint)
	}
	return fmt.Sprintf("%q (%s, %s)", id.Model, id.Arch, fp)
}

// short abbreviates a fingerprint: eight hex digits tell models apart in a message.
func short(fp string) string {
	if len(fp) <= 8 {
		return fp
	}
	return fp[:8] + "…"
}

// validate checks what a Router needs of an identity: positive sizes that fit the trace
// format's bounds, and MoE layers strictly increasing inside the block count.
func (id Identity) validate() error {
	switch {
	case id.Layers < 1 || id.Layers > maxLayers:
		return fmt.Errorf("layers %d: want 1..%d", id.Layers, maxLayers)
	case len(id.MoELayers) == 0:
		return fmt.Errorf("no MoE layers")
	case id.Experts < 1 || id.Experts > maxExperts:
		return fmt.Errorf("experts %d: want 1..%d", id.Experts, maxExperts)
	case id.Used < 1 || id.Used > id.Experts:
		return fmt.Errorf("used %d: want 1..experts (%d)", id.Used, id.Experts)
	case id.Embd < 1 || id.Embd > maxEmbd:
		return fmt.Errorf("embd %d: want 1..%d", id.Embd, maxEmbd)
	}
	for j, l := range id.MoELayers {
		if l < 0 || l >= id.Layers {
			return fmt.Errorf("moe layers[%d] = %d: want 0..%d", j, l, id.Layers-1)
		}
		if j > 0 && l <= id.MoELayers[j-1] {
			return fmt.Errorf("moe layers[%d] = %d: not above moe layers[%d] = %d", j, l, j-1, id.MoELayers[j-1])
		}
	}
	if id.Fingerprint != "" && !isHex64(id.Fingerprint) {
		return fmt.Errorf("fingerprint %q: want 64 hex digits", id.Fingerprint)
	}
	return nil
}

// Bounds as in package trace: they keep a corrupt file from asking for absurd allocations.
const (
	maxLayers  = 1 << 12
	maxExperts = 1<<16 - 1
	maxEmbd    = 1 << 20
)

func isHex64(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, c := range []byte(s) {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}

// target describes what net j of a router over m MoE layers predicts.
func target(j, m int, moe []int) string {
	if j == m-1 {
		return fmt.Sprintf("next token's first MoE layer (block %d)", moe[0])
	}
	return fmt.Sprintf("MoE layer %d (block %d)", j+1, moe[j+1])
}
