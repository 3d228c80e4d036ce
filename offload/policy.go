package offload

import (
	"fmt"
	"strings"
)

// Policy is how the experts a layer needs get onto the device.
type Policy int

const (
	// OnDemand routes, then loads the chosen experts that miss, then computes (vLLM-like).
	OnDemand Policy = iota
	// Prefetch predicts the next layer's experts and loads them early; a wrong prediction is
	// repaired by loading the right experts on demand before computing (MoE-Infinity-like).
	Prefetch
	// Commit computes with the predicted experts and never falls back (CommitMoE); Output
	// Weight Adjustment repairs the mixing weights.
	Commit
	// CPUMiss computes an expert that misses on the host from host memory, overlapped with
	// the device's work, instead of moving it (Fiddler).
	CPUMiss
	// Static is llama.cpp's split (--n-cpu-moe N): the routed experts of the first N MoE
	// layers stay in host memory and the host computes them, every other expert stays on the
	// device, and nothing moves while the model decodes.
	Static
	// StaticCache is Static with the host layers' experts cached in the device memory the
	// device layers leave, least recently used out: one the cache holds is computed on the
	// device, one it misses on the host and then copied in behind, for later tokens.
	StaticCache
	// Hot keeps on the device the experts the router has chosen most often so far, counted
	// over every token, and has the host compute the others; an expert that grows more
	// popular than the least used one on the device is copied in behind the host's work.
	Hot
	// Auto is not a policy of its own but the choice among the others (and their host layers)
	// that the engine predicts decodes fastest on the device, made before the model opens.
	Auto
)

var policyNames = []string{"ondemand", "prefetch", "commit", "cpu-miss", "static", "static-cache", "hot", "auto"}

// Split says whether the policy is llama.cpp's CPU/GPU split, which takes a number of host
// layers (--n-cpu-moe).
func (p Policy) Split() bool { return p == Static || p == StaticCache }

// UsesHost says whether the policy has the host compute experts, at rates it must know.
func (p Policy) UsesHost() bool { return p == CPUMiss || p == Hot || p.Split() }

// MarshalText writes the policy's name, so that JSON reports read "static", not 4.
func (p Policy) MarshalText() ([]byte, error) {
	if p < 0 || int(p) >= len(policyNames) {
		return nil, fmt.Errorf("marshal %v: not a policy", p)
	}
	return []byte(p.String()), nil
}

// UnmarshalText reads a policy's name.
func (p *Policy) UnmarshalText(b []byte) error {
	q, err := ParsePolicy(string(b))
	if err != nil {
		return err
	}
	*p = q
	return nil
}

func (p Policy) String() string {
	if p >= 0 && int(p) < len(policyNames) {
		return policyNames[p]
	}
	return fmt.Sprintf("Policy(%d)", int(p))
}

// CheckTimed refuses to time policy p predicting with predictor where the timing would
// mislead: commit with the oracle, which a running model cannot have (it does not know its
// routing ahead), computes the router's own choice loading on demand, and would be timed as
// ondemand. A timing-only run from recorded routing models an oracle instead.
func CheckTimed(p Policy, predictor string) error {
	if p == Commit && predictor == "oracle" {
		return fmt.Errorf("bench: a running model cannot know its routing ahead, so commit with the oracle would be timed as ondemand; time it from the model's recorded routing with --timing-only")
	}
	return nil
}

// ParsePolicy reads a policy name.
func ParsePolicy(s string) (Policy, error) {
	for i, n := range policyNames {
		if strings.EqualFold(strings.TrimSpace(s), n) {
			return Policy(i), nil
		}
	}
	return 0, fmt.Errorf("unknown expert policy %q: want one of %s", s, strings.Join(policyNames, ", "))
}

// ParsePolicies reads a comma-separated list of policies ("ondemand,commit"), each once.
func ParsePolicies(s string) ([]Policy, error) {
	var out []Policy
	seen := map[Policy]bool{}
	for _, f := range strings.Split(s, ",") {
		p, err := ParsePolicy(f)
		if err != nil {
			return nil, err
		}
		if seen[p] {
			return nil, fmt.Errorf("expert policy %s listed twice in %q", p, s)
		}
		seen[p] = true
		out = append(out, p)
	}
	return out, nil
}
