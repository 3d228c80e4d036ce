package engine

import (
	"context"
	"fmt"
	"unicode/utf8"
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
