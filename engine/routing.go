package engine

import (
	"context"
	"fmt"
	"math"
	"slices"
	"unicode/utf8"

	"github.com/commit-run/commit-run/multigpu"
)

// RouteEvent is one MoE layer's routing of a batch of tokens. The slices belong to the forward
// pass and are valid only during the observer's call; copy what you keep.
type RouteEvent struct {
	Layer  int // block index
	Pos0   int // position of the batch's first token
	Tokens int // tokens in the batch
	// IDs are the batch's token ids.
	IDs     []int32
	Experts int // routed experts of the layer
	Used    int // experts chosen per token (top-k)
	// Input is the router's input, the normalised hidden state: Tokens rows of the embedding
	// width.
	Input []float32
	// Logits are the router's raw outputs: Tokens rows of Experts.
	Logits []float32
	// Selected are the chosen experts, Tokens rows of Used in top-k order; Weights their
	// mixing weights after the architecture's normalisation and scale.
	Selected []int
	Weights  []float32
	// Predicted is the Commit Router's prediction for the next MoE layer (the next token's
	// first after the last), made from this layer's input in a single-token pass; nil where
	// it does not run.
	Predicted []int
}

// RouteObserver receives routing decisions; see Session.ObserveRouting. The event and its
// slices are valid during the call only: the pass reuses their memory.
type RouteObserver func(*RouteEvent)

// LayerRouting summarises one MoE layer's routing over a text.
type LayerRouting struct {
	Layer   int
	Experts int
	Used    int
	Tokens  int
	// Load counts how often each expert was chosen (Tokens*Used in all).
	Load []int
	// MaxOverMean is the busiest expert's load over the mean load (1 = perfectly balanced);
	// Balancedness is its inverse, mean/max, as the expert-parallel literature defines it.
	MaxOverMean  float64
	Balancedness float64
	// Router certainty: KL(softmax(router logits) || uniform) per token, in nats; 0 for a
	// router that cannot tell experts apart, ln(Experts) for one that is certain.
	KLMean, KLStd       float64
	KLP10, KLP50, KLP90 float64
	KLMax               float64 // ln(Experts)
}

// RoutingReport is the outcome of Model.Routing.
type RoutingReport struct {
	Tokens int // tokens evaluated
	Layers []LayerRouting
}

// Routing evaluates text in consecutive windows of window tokens (0 = the context length), as
// Perplexity does, and summarises every MoE layer's expert load and router certainty.
func (m *Model) Routing(ctx context.Context, text string, window int) (RoutingReport, error) {
	ids, window, err := m.windowed(text, window)
	if err != nil {
		return RoutingReport{}, err
	}
	s, err := m.NewSession()
	if err != nil {
		return RoutingReport{}, err
	}
	defer s.Close()
	return m.routingReport(ctx, s, ids, window)
}

func (m *Model) routingReport(ctx context.Context, s *Session, ids []int32, window int) (RoutingReport, error) {
	type acc struct {
		load []int
		kl   []float64
		e, k int
	}
	layers := map[int]*acc{}
	probs := []float64{}
	s.ObserveRouting(func(ev *RouteEvent) {
		a := layers[ev.Layer]
		if a == nil {
			a = &acc{load: make([]int, ev.Experts), e: ev.Experts, k: ev.Used}
			layers[ev.Layer] = a
		}
		for _, e := range ev.Selected {
			a.load[e]++
		}
		for t := 0; t < ev.Tokens; t++ {
			if len(probs) < ev.Experts {
				probs = make([]float64, ev.Experts)
			}
			a.kl = append(a.kl, multigpu.KLFromUniform(ev.Logits[t*ev.Experts:(t+1)*ev.Experts], probs[:ev.Experts]))
		}
	})
	n, err := s.observe(ctx, ids, window)
	rep := RoutingReport{Tokens: n}
	if err != nil {
		return rep, err
	}
	keys := make([]int, 0, len(layers))
	for l := range layers {
		keys = append(keys, l)
	}
	slices.Sort(keys)
	for _, l := range keys {
		a := layers[l]
		lr := LayerRouting{Layer: l, Experts: a.e, Used: a.k, Tokens: len(a.kl), Load: a.load, KLMax: math.Log(float64(a.e))}
		busiest := slices.Max(a.load)
		mean := float64(len(a.kl)*a.k) / float64(a.e)
		if mean > 0 {
			lr.MaxOverMean = float64(busiest) / mean
			lr.Balancedness = mean / float64(busiest)
		}
		var sum, sq float64
		for _, v := range a.kl {
			sum += v
			sq += v * v
		}
		n := float64(len(a.kl))
		lr.KLMean = sum / n
		lr.KLStd = math.Sqrt(max(0, sq/n-lr.KLMean*lr.KLMean))
		sorted := slices.Clone(a.kl)
		slices.Sort(sorted)
		q := func(p float64) float64 { return sorted[min(len(sorted)-1, int(p*float64(len(sorted))))] }
		lr.KLP10, lr.KLP50, lr.KLP90 = q(0.1), q(0.5), q(0.9)
		rep.Layers = append(rep.Layers, lr)
	}
	return rep, nil
}

// Observe runs text through the model in consecutive windows of window tokens (0 = the
// context length), each from an empty cache, as Perplexity does, and reports every MoE
// layer's routing to obs. Teacher-forced tokens route exactly as the same tokens would when
// decoded one by one. It returns the number of tokens evaluated.
func (m *Model) Observe(ctx context.Context, text string, window int, obs RouteObserver) (int, error) {
	if obs == nil {
		return 0, fmt.Errorf("observe: no observer")
	}
	ids, window, err := m.windowed(text, window)
	if err != nil {
		return 0, err
	}
	s, err := m.NewSession()
	if err != nil {
		return 0, err
	}
	defer s.Close()
	s.ObserveRouting(obs)
	return s.observe(ctx, ids, window)
}

// observe evaluates ids window by window on s (whose observer is set) without computing the
// distribution over the vocabulary for more than one position per batch.
func (s *Session) observe(ctx context.Context, ids []int32, window int) (int, error) {
	n := 0
	for start := 0; start < len(ids); start += window {
		win := ids[start:min(start+window, len(ids))]
		if err := s.run(ctx, win); err != nil {
			return n, err
		}
		n += len(win)
	}
	return n, nil
}

// CheckUTF8 says where text stops being UTF-8, which the tokenizers need: an error that
// names the byte offset of the first invalid byte, or nil.
func CheckUTF8(text string) error {
	for i, r := range text {
		if r == utf8.RuneError {
			if _, size := utf8.DecodeRuneInString(text[i:]); size == 1 {
				return fmt.Errorf("not valid UTF-8 at byte %d", i)
			}
		}
	}
	return nil
}

// windowed validates an evaluation text and window and returns the text's tokens and the
// window to use.
func (m *Model) windowed(text string, window int) ([]int32, int, error) {
	if window < 0 || window == 1 {
		return nil, 0, fmt.Errorf("window %d: want 0 (context length) or at least 2", window)
	}
	if window == 0 || window > m.nctx {
		window = m.nctx
	}
	if err := CheckUTF8(text); err != nil {
		return nil, 0, fmt.Errorf("text: %w", err)
	}
	ids, err := m.tok.Encode(text, false, false)
	if err != nil {
		return nil, 0, err
	}
	if len(ids) < 2 {
		return nil, 0, fmt.Errorf("text has %d tokens; need at least 2", len(ids))
	}
	return ids, window, nil
}
