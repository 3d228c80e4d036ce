package offload

import (
	"fmt"
	"math"
	"slices"

	"github.com/commit-run/commit-run/sim"
)

// Cost is what one kernel (or a group of kernels priced together) reads and computes.
type Cost struct {
	Bytes, FLOPs float64
	Kernels      int // launches the group stands for; 0 counts as 1
}

// Shape is the timing model of a model at batch size 1: what every part of one decode token
// costs, without any weights. It describes real models (from a GGUF file's metadata) and
// the public shapes of models no machine here can hold (DESIGN.md §7).
type Shape struct {
	Name        string
	DenseLayers int // leading blocks with a dense FFN instead of experts (DeepSeek-V2)
	MoELayers   int
	Experts     int
	Used        int // top-k
	// Embd is the hidden width: a token's activations are Embd values (expert parallelism
	// sends them between devices).
	Embd int
	// ExpertBytes is one routed expert's weights as stored (the slot size); ExpertFLOPs one
	// token through one expert.
	ExpertBytes float64
	ExpertFLOPs float64
	Attn        Cost // per block: norms, projections, attention over the cache
	Router      Cost // per MoE block
	Shared      Cost // per MoE block: shared experts, zero if none
	Dense       Cost // per dense block: its FFN
	Head        Cost // final norm and output projection
	// Predictor is the Commit Router's cost per MoE block (prefetch and commit run it).
	Predictor Cost
	// Resident is what always stays on the device: non-expert weights, KV cache, buffers.
	Resident float64
}

// Validate checks that the shape can be timed.
func (s *Shape) Validate() error {
	switch {
	case s.MoELayers < 1 || s.DenseLayers < 0:
		return fmt.Errorf("shape %s: %d MoE and %d dense layers", s.Name, s.MoELayers, s.DenseLayers)
	case s.Experts < 1 || s.Used < 1 || s.Used > s.Experts:
		return fmt.Errorf("shape %s: top-%d of %d experts", s.Name, s.Used, s.Experts)
	case !(s.ExpertBytes > 0) || math.IsInf(s.ExpertBytes, 0) || s.ExpertFLOPs < 0 || s.Resident < 0:
		return fmt.Errorf("shape %s: expert bytes %v, flops %v, resident %v", s.Name, s.ExpertBytes, s.ExpertFLOPs, s.Resident)
	}
	return nil
}

// Slots is how many expert slots a device budget of budget bytes holds once the resident
// part is placed, or an error that says how much is needed: at least one layer's top-k, and
// for the predicting policies the next layer's too.
func (s *Shape) Slots(budget float64, p Policy) (int, error) {
	need := s.Used
	if p.predicts() {
		need = 2 * s.Used
	}
	if !(budget > 0) || math.IsInf(budget, 0) {
		return 0, fmt.Errorf("device memory budget %v bytes: want a positive size", budget)
	}
	slots := int(math.Floor((budget - s.Resident) / s.ExpertBytes))
	if slots < need {
		min := s.Resident + float64(need)*s.ExpertBytes
		return 0, fmt.Errorf("shape %s with policy %s needs at least %.0f MiB of device memory (%.0f MiB resident + %d expert slots of %.1f MiB); the budget is %.0f MiB",
			s.Name, p, min/(1<<20), s.Resident/(1<<20), need, s.ExpertBytes/(1<<20), budget/(1<<20))
	}
	return min(slots, s.Experts*s.MoELayers), nil
}

// Predictor gives the experts predicted for MoE layer j of token t, made while the previous
// MoE layer runs (for j = 0: the previous token's last layer). truth is what the router will
// choose; a predictor may look at it only to model a given accuracy.
type Predictor interface {
	Predict(t, j int, truth []int) []int
}

// CPUCost prices computing one expert for one token on the host (cpu-miss).
type CPUCost struct {
	// Bandwidth is the host memory bandwidth the expert's weights are read at, bytes/s.
	Bandwidth float64
	// Overhead is the fixed cost per expert: dispatch, and moving the activation both ways.
	Overhead float64
}

// Seconds is the host time of one expert of b bytes.
func (c CPUCost) Seconds(b float64) float64 { return b/c.Bandwidth + c.Overhead }

// Timing configures a timing run of one policy.
type Timing struct {
	Shape    *Shape
	Profile  *sim.Profile
	Policy   Policy
	Eviction Eviction
	Slots    int
	Predict  Predictor // prefetch and commit
	CPU      CPUCost   // cpu-miss
	// CrossToken commits each token's first MoE layer to the prediction made from the
	// previous token (CommitMoE's whole pipeline). Without it that layer waits for its router,
	// as the engine's commit does by default, and the prediction only prefetches.
	CrossToken bool
}

// TokenStats are one decode token's figures.
type TokenStats struct {
	Latency float64 // host time from the token's start to its logits
	Stall   float64 // compute-stream time spent waiting for copies (or host results)
	Compute float64 // sum of kernel times: the token's compute if nothing waited
	Moved   float64 // bytes copied to the device
	// Needed is the bytes of the experts the token computed with on the device that were not
	// resident when the token started: what any schedule has to move.
	Needed float64
	Limit  float64 // the physical limit: max(Compute, Needed / PCIe bandwidth)
	Hits   int     // experts found resident (or in flight from a prefetch) when needed
	Misses int     // experts loaded on demand, or computed on the host by cpu-miss
	OnCPU  int     // experts computed on the host
	// Correct counts predicted experts that the router also chose, Predicted the
	// predictions made (prefetch, commit).
	Correct, Predicted int
}

// Run times tokens (each a list per MoE layer of the experts the router chooses, top-k
// order) on the profile's timeline and returns each token's figures. The timeline keeps
// every span for drawing.
func (c *Timing) Run(tl *sim.Timeline, tokens [][][]int) ([]TokenStats, error) {
	_, st, err := c.RunPrompt(tl, nil, tokens)
	return st, err
}

// RunPrompt times the prefill of prompt (its tokens' routing, as for Run) in one batch, then
// decodes tokens with the cache the prefill left, and returns the time to first token (0 for
// an empty prompt) and each decode token's figures.
func (c *Timing) RunPrompt(tl *sim.Timeline, prompt, tokens [][][]int) (float64, []TokenStats, error) {
	r, err := c.start(tl)
	if err != nil {
		return 0, nil, err
	}
	var ttft float64
	if len(prompt) > 0 {
		for t, layers := range prompt {
			if err := c.checkToken(layers); err != nil {
				return 0, nil, fmt.Errorf("prompt token %d: %w", t, err)
			}
		}
		if ttft, err = r.prefill(prompt); err != nil {
			return 0, nil, err
		}
	}
	out := make([]TokenStats, 0, len(tokens))
	for t, layers := range tokens {
		if err := c.checkToken(layers); err != nil {
			return ttft, out, fmt.Errorf("token %d: %w", t, err)
		}
		st, err := r.token(t, layers, tokens)
		if err != nil {
			return ttft, out, err
		}
		out = append(out, st)
	}
	return ttft, out, nil
}

// checkToken checks one token's routing against the shape.
func (c *Timing) checkToken(layers [][]int) error {
	if len(layers) != c.Shape.MoELayers {
		return fmt.Errorf("routes %d MoE layers, the shape has %d", len(layers), c.Shape.MoELayers)
	}
	for j, ex := range layers {
		if err := checkExperts(ex, c.Shape); err != nil {
			return fmt.Errorf("MoE layer %d: %w", j, err)
		}
	}
	return nil
}

// start validates the configuration and makes the run's streams and cache.
func (c *Timing) start(tl *sim.Timeline) (*timingRun, error) {
	s := c.Shape
	if err := s.Validate(); err != nil {
		return nil, err
	}
	if c.Policy.predicts() && c.Predict == nil {
		return nil, fmt.Errorf("policy %s needs a predictor", c.Policy)
	}
	if c.Policy == CPUMiss && !(c.CPU.Bandwidth > 0) {
		return nil, fmt.Errorf("policy cpu-miss needs the host's expert bandwidth")
	}
	cache, err := NewCache(c.Slots, c.Eviction)
	if err != nil {
		return nil, err
	}
	r := &timingRun{Timing: c, tl: tl, cache: cache, ready: map[ExpertKey]sim.Event{}, free: map[int]sim.Event{}}
	r.compute, r.copy = tl.NewStream("compute"), tl.NewStream("copy")
	if c.Policy == CPUMiss {
		r.cpu = tl.NewStream("cpu")
	}
	return r, nil
}

func checkExperts(ex []int, s *Shape) error {
	if len(ex) != s.Used {
		return fmt.Errorf("%d experts chosen, want top-%d", len(ex), s.Used)
	}
	for i, e := range ex {
		if e < 0 || e >= s.Experts || slices.Contains(ex[:i], e) {
			return fmt.Errorf("experts %v: out of range or repeated", ex)
		}
	}
	return nil
}

type timingRun struct {
	*Timing
	tl            *sim.Timeline
	compute, copy *sim.Stream
	cpu           *sim.Stream // the host's expert workers (cpu-miss), beside the issuing thread
	cache         *Cache
	ready         map[ExpertKey]sim.Event // when a slot's copy of the expert lands
	free          map[int]sim.Event       // when the last kernel reading a slot ends
	pending       [][]int                 // experts predicted for the next MoE layer
}

func (r *timingRun) kernel(kind, label string, c Cost, st *TokenStats) {
	n := max(c.Kernels, 1)
	d := r.Profile.KernelTime(c.Bytes, c.FLOPs) + float64(n-1)*r.Profile.LaunchOverhead
	if c.Bytes == 0 && c.FLOPs == 0 {
		return
	}
	r.compute.Enqueue(kind, label, d)
	st.Compute += d
}

// load makes sure expert k is resident or on its way, copying it if not, and returns when
// it is ready; hit says it was already there.
func (r *timingRun) load(k ExpertKey, st *TokenStats) (sim.Event, bool, error) {
	slot, hit, _, _, err := r.cache.Assign(k)
	if err != nil {
		return sim.Event{}, false, fmt.Errorf("load expert %v: %w", k, err)
	}
	if hit {
		return r.ready[k], true, nil
	}
	// The slot is overwritten in place: wait for the kernels still reading its old expert.
	r.copy.Wait(r.free[slot])
	r.copy.Enqueue("copy", fmt.Sprintf("L%d E%d", k.Layer, k.Expert), r.Profile.CopyTime(r.Shape.ExpertBytes))
	ev := r.copy.Record()
	r.ready[k] = ev
	st.Moved += r.Shape.ExpertBytes
	return ev, false, nil
}

// prefill runs the prompt's tokens through every layer in one batch: each weight is read
// once and its flops scale with the tokens; the experts a layer's tokens choose are loaded
// on demand whatever the policy (a prediction is per token; a prompt's batch needs most
// experts anyway), each computed for the tokens that chose it as soon as it lands. Attention
// is priced at the shape's context for every prompt token: an approximation that
// overstates short prompts. It returns the time to the first token's logits.
func (r *timingRun) prefill(prompt [][][]int) (float64, error) {
	s := r.Shape
	var st TokenStats
	start := r.tl.Now()
	T := float64(len(prompt))
	batch := func(c Cost) Cost { return Cost{Bytes: c.Bytes, FLOPs: c.FLOPs * T, Kernels: c.Kernels} }
	for d := 0; d < s.DenseLayers; d++ {
		r.kernel("attention", fmt.Sprintf("attn D%d", d), batch(s.Attn), &st)
		r.kernel("dense", fmt.Sprintf("ffn D%d", d), batch(s.Dense), &st)
	}
	for j := 0; j < s.MoELayers; j++ {
		lbl := fmt.Sprintf("L%d", j)
		r.kernel("attention", "attn "+lbl, batch(s.Attn), &st)
		r.kernel("router", "router "+lbl, batch(s.Router), &st)
		r.tl.HostWait(r.compute.Record())
		// The experts in order of first use, and how many tokens chose each.
		var order []int
		uses := map[int]int{}
		for _, layers := range prompt {
			for _, e := range layers[j] {
				if uses[e] == 0 {
					order = append(order, e)
				}
				uses[e]++
			}
		}
		// Resident experts first, while the misses are on their way.
		slices.SortStableFunc(order, func(a, b int) int {
			_, ra := r.cache.Lookup(ExpertKey{j, a})
			_, rb := r.cache.Lookup(ExpertKey{j, b})
			switch {
			case ra && !rb:
				return -1
			case rb && !ra:
				return 1
			}
			return 0
		})
		for _, e := range order {
			k := ExpertKey{j, e}
			ev, _, err := r.load(k, &st)
			if err != nil {
				return 0, err
			}
			r.compute.Wait(ev)
			r.kernel("expert", fmt.Sprintf("L%d E%d x%d", j, e, uses[e]), Cost{Bytes: s.ExpertBytes, FLOPs: s.ExpertFLOPs * float64(uses[e])}, &st)
			slot, _ := r.cache.Lookup(k)
			r.free[slot] = r.compute.Record()
		}
		r.kernel("shared", "shared "+lbl, batch(s.Shared), &st)
	}
	r.kernel("head", "head", s.Head, &st) // the last token's logits only
	r.tl.HostWait(r.compute.Record())
	return r.tl.Now() - start, nil
}

func (r *timingRun) token(t int, layers [][]int, all [][][]int) (TokenStats, error) {
	s := r.Shape
	var st TokenStats
	start := r.tl.Now()
	stall0 := r.compute.Stalled()

	// What the token needs that is not on the device at its start: the physical limit's bytes.
	residentAtStart := map[ExpertKey]bool{}
	for _, k := range r.cache.Resident() {
		residentAtStart[k] = true
	}

	for d := 0; d < s.DenseLayers; d++ {
		r.kernel("attention", fmt.Sprintf("attn D%d", d), s.Attn, &st)
		r.kernel("dense", fmt.Sprintf("ffn D%d", d), s.Dense, &st)
	}
	for j, truth := range layers {
		lbl := fmt.Sprintf("L%d", j)
		r.kernel("attention", "attn "+lbl, s.Attn, &st)
		r.kernel("router", "router "+lbl, s.Router, &st)

		// The experts this layer computes with.
		use := truth
		committed := r.Policy == Commit && r.pending != nil && (j > 0 || r.CrossToken)
		if committed {
			use = r.pending[j]
		} else {
			// The host needs the router's choice to issue loads.
			r.tl.HostWait(r.compute.Record())
		}
		if r.Policy.predicts() && r.pending != nil {
			for _, e := range r.pending[j] {
				st.Predicted++
				if slices.Contains(truth, e) {
					st.Correct++
				}
			}
		}

		// Pin this layer's experts while they load and compute, so the next layer's
		// prefetch cannot take their slots.
		var waits []sim.Event
		var onCPU []int
		for _, e := range use {
			k := ExpertKey{j, e}
			if r.Policy == CPUMiss {
				// A miss runs on the host's expert workers when they would finish it before
				// the copy stream could deliver it: queue-aware, so that with several misses
				// some are copied while others are computed on the host.
				if _, ok := r.cache.Lookup(k); !ok {
					now := r.tl.Now()
					cpuDone := max(r.cpu.Tail(), now) + r.CPU.Seconds(s.ExpertBytes)
					copyDone := max(r.copy.Tail(), now) + r.Profile.CopyTime(s.ExpertBytes)
					if cpuDone <= copyDone {
						r.cpu.Enqueue("cpu", fmt.Sprintf("cpu L%d E%d", j, e), r.CPU.Seconds(s.ExpertBytes))
						onCPU = append(onCPU, e)
						st.Misses++
						st.OnCPU++
						continue
					}
				}
			}
			if !residentAtStart[k] {
				st.Needed += s.ExpertBytes
			}
			ev, hit, err := r.load(k, &st)
			if err != nil {
				return st, err
			}
			if err := r.cache.Pin(k); err != nil {
				return st, err
			}
			if hit {
				st.Hits++
			} else {
				st.Misses++
			}
			waits = append(waits, ev)
		}

		// Predict and prefetch the next MoE layer (or the next token's first) while this one
		// computes; the host reads the predictor's output to issue the copies.
		if r.Policy.predicts() {
			nj, nt := j+1, t
			if nj == len(layers) {
				nj, nt = 0, t+1
			}
			r.kernel("predictor", "predict "+lbl, s.Predictor, &st)
			if nt < len(all) {
				r.tl.HostWait(r.compute.Record())
				pred := r.Predict.Predict(nt, nj, all[nt][nj])
				if err := checkExperts(pred, s); err != nil {
					return st, fmt.Errorf("prediction for token %d, MoE layer %d: %w", nt, nj, err)
				}
				if r.pending == nil {
					r.pending = make([][]int, len(layers))
				}
				r.pending[nj] = pred
				for _, e := range pred {
					if _, _, err := r.load(ExpertKey{nj, e}, &st); err != nil {
						return st, err
					}
				}
			}
		}

		// Experts computed on the host run while the device computes the resident ones; the
		// device then waits for their results.
		for i, e := range slices.DeleteFunc(slices.Clone(use), func(e int) bool { return slices.Contains(onCPU, e) }) {
			k := ExpertKey{j, e}
			r.compute.Wait(waits[i])
			r.kernel("expert", fmt.Sprintf("L%d E%d", j, e), Cost{Bytes: s.ExpertBytes, FLOPs: s.ExpertFLOPs}, &st)
			slot, _ := r.cache.Lookup(k)
			r.free[slot] = r.compute.Record()
			if err := r.cache.Unpin(k); err != nil {
				return st, err
			}
		}
		r.kernel("shared", "shared "+lbl, s.Shared, &st)
		if len(onCPU) > 0 {
			r.compute.Wait(r.cpu.Record())
		}
	}
	r.kernel("head", "head", s.Head, &st)
	r.tl.HostWait(r.compute.Record()) // sampling reads the logits
	st.Latency = r.tl.Now() - start
	st.Stall = r.compute.Stalled() - stall0
	st.Limit = max(st.Compute, st.Needed/r.Profile.PCIeEffective)
	return st, nil
}
