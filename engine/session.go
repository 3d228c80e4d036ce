package engine

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/commit-run/commit-run/grammar"
	"github.com/commit-run/commit-run/models"
	"github.com/commit-run/commit-run/sample"
	"github.com/commit-run/commit-run/tokenizer"
)

// Session is one conversation's state on a Model: its KV cache and the tokens in it. Calls on
// one session are serialised; use one session per concurrent conversation.
type Session struct {
	m      *Model
	mu     sync.Mutex
	kv     *models.KVCache
	tokens []int32 // the tokens whose keys and values are in kv
	closed bool
	route  RouteObserver
	commit *commitState // the Commit Router's pending predictions; nil when not committing
	step   stepReq      // its decode steps under continuous batching
}

// ObserveRouting makes every later forward pass of the session report each MoE layer's
// routing to obs (nil stops it). obs runs on the session's goroutine, inside the pass.
func (s *Session) ObserveRouting(obs RouteObserver) {
	s.mu.Lock()
	s.route = obs
	s.mu.Unlock()
}

// prefillBatch bounds the tokens evaluated in one forward pass, which bounds the activation
// memory of a long prompt. Numbers do not depend on it: every row is computed independently.
const prefillBatch = 256

// NewSession creates a session with its own KV cache of ContextLength positions.
func (m *Model) NewSession() (*Session, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return nil, ErrClosed
	}
	if err := m.dev.Memory().Alloc(kvCacheBytes(m), "a session's KV cache"); err != nil {
		return nil, fmt.Errorf("new session on %s: %w", m.dev.Name(), err)
	}
	kv, err := m.newKV()
	if err != nil {
		m.dev.Memory().Free(kvCacheBytes(m))
		return nil, fmt.Errorf("new session on %s: %w", m.dev.Name(), err)
	}
	s := &Session{m: m, kv: kv}
	if m.batch != nil {
		s.step.done = make(chan struct{}, 1)
	}
	if m.commit != nil {
		s.commit = m.commit.newState()
	}
	return s, nil
}

// Shared returns how many leading tokens of tokens the session's KV cache holds already:
// what Generate with that prompt would not evaluate again. A server picks by it the session
// that serves a request, so that the next turn of a conversation finds its own cache.
func (s *Session) Shared(tokens []int32) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.kv.Resumable(commonPrefix(s.tokens, tokens))
}

// commonPrefix is how many leading tokens a and b share.
func commonPrefix(a, b []int32) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// Reset forgets the session's tokens.
func (s *Session) Reset() {
	s.mu.Lock()
	s.tokens = s.tokens[:0]
	s.mu.Unlock()
}

// Close frees the session's KV cache.
func (s *Session) Close() error {
	s.mu.Lock()
	if !s.closed && s.kv != nil {
		s.m.freeKV(s.kv)
		s.m.dev.Memory().Free(kvCacheBytes(s.m)) // what NewSession reserved, snapshots included
	}
	s.closed = true
	s.kv = nil
	s.tokens = nil
	s.mu.Unlock()
	return nil
}

func (s *Session) checkTokens(tokens []int32) error {
	vocab := s.m.arch.Config.Vocab
	for i, id := range tokens {
		if id < 0 || int(id) >= vocab {
			return fmt.Errorf("token %d at position %d is outside the vocabulary [0, %d)", id, i, vocab)
		}
	}
	if len(tokens) > s.m.nctx {
		if trained := s.m.arch.Config.ContextLen; s.m.nctx < trained {
			return fmt.Errorf("prompt of %d tokens does not fit the context of %d tokens (raise it with the context length option, up to the model's %d)", len(tokens), s.m.nctx, trained)
		}
		return fmt.Errorf("prompt of %d tokens does not fit the context of %d tokens (the context length option raises it to %d at most; the model was trained on %d)", len(tokens), s.m.nctx, MaxContextLength, s.m.arch.Config.ContextLen)
	}
	return nil
}

// eval appends tokens to the session and returns the logits after the last one (or after
// each one when all is set). It holds the model's read lock per batch so Close cannot unmap
// weights under it, and checks ctx between batches.
func (s *Session) eval(ctx context.Context, tokens []int32, all bool) ([]float32, error) {
	var out []float32
	for len(tokens) > 0 {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		n := min(len(tokens), prefillBatch)
		batch := tokens[:n]
		s.m.mu.RLock()
		if s.m.closed {
			s.m.mu.RUnlock()
			return nil, ErrClosed
		}
		want := lastLogits
		switch {
		case all:
			want = allLogits
		case n < len(tokens):
			want = noLogits
		}
		logits, err := s.m.block.pass(s.kv, batch, len(s.tokens), want, s.route, s.commit)
		s.m.mu.RUnlock()
		if err != nil {
			return nil, err
		}
		s.tokens = append(s.tokens, batch...)
		tokens = tokens[n:]
		if all {
			out = append(out, logits...)
		} else {
			out = logits
		}
	}
	return out, nil
}

// restart checks tokens for an evaluation from position 0 and empties the cache; the caller
// holds s.mu.
func (s *Session) restart(tokens []int32) error {
	if s.closed {
		return ErrClosed
	}
	if err := s.checkTokens(tokens); err != nil {
		return err
	}
	s.tokens = s.tokens[:0]
	return nil
}

// run evaluates tokens from position 0, keeping only the last position's logits.
func (s *Session) run(ctx context.Context, tokens []int32) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.restart(tokens); err != nil {
		return err
	}
	_, err := s.eval(ctx, tokens, false)
	return err
}

// Probs evaluates tokens from position 0 and calls fn with the next-token distribution after
// each position. The slice passed to fn is reused between calls.
func (s *Session) Probs(ctx context.Context, tokens []int32, fn func(pos int, probs []float32) error) error {
	return s.probs(ctx, tokens, prefillBatch, fn)
}

// probs is Probs with step tokens per forward pass.
func (s *Session) probs(ctx context.Context, tokens []int32, step int, fn func(pos int, probs []float32) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.restart(tokens); err != nil {
		return err
	}
	vocab := s.m.arch.Config.Vocab
	probs := make([]float32, vocab)
	for start := 0; start < len(tokens); start += step {
		end := min(start+step, len(tokens))
		logits, err := s.eval(ctx, tokens[start:end], true)
		if err != nil {
			return err
		}
		for t := 0; t < end-start; t++ {
			sample.Softmax(probs, logits[t*vocab:(t+1)*vocab])
			if err := fn(start+t, probs); err != nil {
				return err
			}
		}
	}
	return nil
}

// Generate continues the token sequence prompt (the whole sequence from position 0: the
// prefix already in the cache is reused) and samples up to opts.MaxTokens tokens.
func (s *Session) Generate(ctx context.Context, prompt []int32, opts GenerateOptions) (res Result, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return Result{}, ErrClosed
	}
	if err := s.checkGenerate(prompt, opts); err != nil {
		return Result{}, err
	}
	res.PromptTokens = len(prompt)
	// Reuse the cached prefix, but always evaluate at least one token to get logits.
	// A model with recurrent layers resumes where their states allow.
	keep := s.kv.Rewind(commonPrefix(s.tokens, prompt[:len(prompt)-1]), s.m.ops)
	s.tokens = s.tokens[:keep]
	res.CachedTokens = keep
	start := time.Now()
	logits, err := s.eval(ctx, prompt[keep:], false)
	res.PromptSeconds = time.Since(start).Seconds()
	if err != nil {
		return res, err
	}
	g := s.newGeneration(opts, &res, len(logits))
	decodeStart := time.Now()
	defer func() { res.DecodeSeconds = time.Since(decodeStart).Seconds() }()
	defer g.leave()
	if err := g.run(ctx, logits); err != nil {
		return res, err
	}
	return res, nil
}

// checkGenerate refuses a request Generate cannot serve before any work is done.
func (s *Session) checkGenerate(prompt []int32, opts GenerateOptions) error {
	if len(prompt) == 0 {
		return fmt.Errorf("empty prompt: give at least one token")
	}
	if opts.MaxTokens < 0 {
		return fmt.Errorf("max tokens %d: want 0 (until EOS or the context is full) or more", opts.MaxTokens)
	}
	if err := opts.Sampler.Validate(); err != nil {
		return err
	}
	if opts.TopLogprobs < 0 || opts.TopLogprobs > 20 {
		return fmt.Errorf("top logprobs %d: want 0 to 20", opts.TopLogprobs)
	}
	return s.checkTokens(prompt)
}

// A generation is Generate's decode loop: the sampler chain, the stream decoder and the stop
// strings of one call, and what it has produced so far in res.
type generation struct {
	s    *Session
	opts GenerateOptions
	res  *Result
	smp  *sample.Sampler
	dec  *tokenizer.StreamDecoder
	stop *sample.Stops
	// joined: a member of the model's batched steps, which it leaves when done.
	joined     bool
	lpBuf, raw []float32 // log-probabilities' scratch, and the logits before the sampler
	gram       *grammar.Matcher
	// pieces: the tokens' bytes so far, while a lazy grammar waits for its trigger (as
	// bytes, converted once)
	pieces, trigger []byte
}

func (s *Session) newGeneration(opts GenerateOptions, res *Result, vocab int) *generation {
	g := &generation{s: s, opts: opts, res: res, smp: sample.New(opts.Sampler),
		dec: s.m.tok.NewStreamDecoder(), stop: sample.NewStops(opts.Stop)}
	if opts.Logprobs {
		g.lpBuf, g.raw = make([]float32, vocab), make([]float32, vocab)
	}
	switch {
	case opts.Grammar != nil && opts.GrammarTrigger == "":
		g.gram = grammar.NewMatcher(grammar.TokenizerVocab(s.m.tok), opts.Grammar)
		g.smp.SetFilter(g.gram)
	case opts.Grammar != nil:
		g.trigger = []byte(opts.GrammarTrigger)
	}
	return g
}

// awaitTrigger starts a lazy grammar once the tokens' bytes hold its trigger, fed the bytes from
// the trigger's start. Bytes the grammar refuses there (a token that wrote past the trigger
// into something else) leave the answer free: the grammar cannot hold what is written.
func (g *generation) awaitTrigger(id int32) {
	if g.trigger == nil {
		return
	}
	g.pieces = append(g.pieces, g.s.m.tok.TokenText(id)...)
	i := bytes.Index(g.pieces, g.trigger)
	if i < 0 {
		// Only the trigger's start, less its last byte, can still begin it.
		if keep := len(g.trigger) - 1; len(g.pieces) > keep {
			g.pieces = append(g.pieces[:0], g.pieces[len(g.pieces)-keep:]...)
		}
		return
	}
	m := grammar.NewMatcher(grammar.TokenizerVocab(g.s.m.tok), g.opts.Grammar)
	if m.Feed(g.pieces[i:]) {
		g.gram = m
		g.smp.SetFilter(m)
	}
	g.trigger, g.pieces = nil, nil
}

// leave takes the session out of the model's batched steps, if it joined them.
func (g *generation) leave() {
	if g.joined {
		g.s.m.batch.leave()
	}
}

// run samples from logits, the prompt's last, until a stop. Each iteration samples from the
// logits in hand and evaluates the new token only when another one will be sampled, so N
// tokens cost N-1 decode steps after the prompt.
func (g *generation) run(ctx context.Context, logits []float32) error {
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		id, done, err := g.next(logits)
		if err != nil || done {
			return err
		}
		if logits, err = g.s.decode(ctx, id, &g.joined); err != nil {
			return err
		}
	}
}

// next samples the token after logits and emits it; done says the generation stops there,
// with res.Reason set and what the stop strings held back flushed.
func (g *generation) next(logits []float32) (id int32, done bool, err error) {
	opts, res := g.opts, g.res
	if opts.Logprobs {
		copy(g.raw, logits) // the model's distribution, before the sampler changes logits
	}
	id = g.smp.Sample(logits, g.s.tokens)
	if g.gram != nil {
		if err := g.gram.Err(); err != nil || id < 0 {
			return id, true, fmt.Errorf("%s after %q: %w", opts.Grammar, res.Text, cmp.Or(err, errNoToken))
		}
	}
	if (!opts.IgnoreEOS || g.gram != nil) && g.s.m.tok.IsEOG(id) {
		res.Reason = StopEOS
		return id, true, g.flush()
	}
	res.Tokens = append(res.Tokens, id)
	g.awaitTrigger(id)
	var lp *Logprob
	if opts.Logprobs {
		l := sample.Logprobs(g.raw, g.lpBuf, id, opts.TopLogprobs)
		res.Logprobs = append(res.Logprobs, l)
		lp = &l
	}
	out, hit := g.stop.Push(g.dec.Next(id))
	if err := g.emit(id, out, lp); err != nil {
		return id, true, err
	}
	switch {
	case hit:
		res.Reason = StopString
		return id, true, nil
	case g.gram != nil && g.gram.Done():
		res.Reason = StopGrammar
	case opts.MaxTokens > 0 && len(res.Tokens) >= opts.MaxTokens:
		res.Reason = StopMaxTokens
	case len(g.s.tokens) >= g.s.m.nctx:
		res.Reason = StopContext
	default:
		return id, false, nil
	}
	return id, true, g.flush()
}

// flush emits the text the stop strings held back, which no stop string matched.
func (g *generation) flush() error {
	if tail := g.stop.Flush(); tail != "" {
		return g.emit(-1, tail, nil)
	}
	return nil
}

// emit adds piece to the answer and hands it to the caller's OnToken; id -1 is text with no
// token of its own (the stop strings' held-back tail).
func (g *generation) emit(id int32, piece string, lp *Logprob) error {
	g.res.Text += piece
	if g.opts.OnToken != nil && (piece != "" || id >= 0) {
		return g.opts.OnToken(Token{ID: id, Text: piece, Logprob: lp})
	}
	return nil
}

// Chat renders the conversation with the model's chat template and generates the next
// assistant turn; the rendered prefix shared with the previous call is not recomputed.
func (s *Session) Chat(ctx context.Context, msgs []Message, opts GenerateOptions) (Result, error) {
	ids, err := s.m.ChatTokens(msgs)
	if err != nil {
		return Result{}, err
	}
	// A grammar ends the turn itself, and the model's chat stops may be text inside its value.
	if stops := s.m.info.ChatStop; len(stops) > 0 && opts.Grammar == nil {
		opts.Stop = append(slices.Clip(opts.Stop), stops...)
	}
	return s.Generate(ctx, ids, opts)
}

// ChatTokens renders the conversation with the model's chat template, the assistant's turn
// opened, and returns its tokens: what Session.Chat generates from.
func (m *Model) ChatTokens(msgs []Message) ([]int32, error) {
	return m.ChatTokensWith(msgs, ChatOptions{})
}

// Perplexity scores text in consecutive windows of window tokens (0 = the context length),
// each evaluated from an empty cache; every token but a window's first is predicted.
func (m *Model) Perplexity(ctx context.Context, text string, window int) (PerplexityResult, error) {
	return m.PerplexityWith(ctx, text, PerplexityOptions{Window: window})
}

// PerplexityOptions configure PerplexityWith.
type PerplexityOptions struct {
	// Window is the tokens per window; 0 = the context length.
	Window int
	// Decode evaluates one token per forward pass, as decoding runs, instead of a window's
	// tokens in batches: what committed routing, which acts on single-token passes only, is
	// measured with. Slower, and with the same numbers as batches when nothing commits.
	Decode bool
	// MaxTokens stops after the windows that hold this many tokens (0 = all of the text).
	MaxTokens int
}

// PerplexityWith is Perplexity with options.
func (m *Model) PerplexityWith(ctx context.Context, text string, o PerplexityOptions) (PerplexityResult, error) {
	if o.MaxTokens < 0 {
		return PerplexityResult{}, fmt.Errorf("perplexity: max tokens %d: want 0 (all) or more", o.MaxTokens)
	}
	ids, window, err := m.windowed(text, o.Window)
	if err != nil {
		return PerplexityResult{}, err
	}
	if o.MaxTokens > 0 && o.MaxTokens < len(ids) {
		ids = ids[:o.MaxTokens]
		text = m.tok.Detokenize(ids, false, false)
	}
	step := prefillBatch
	if o.Decode {
		step = 1
	}
	// Bits per byte count the bytes of the scored tokens only: a window's first token is
	// context, not prediction.
	res := PerplexityResult{Bytes: len(text)}
	for start := 0; start+1 < len(ids); start += window {
		res.Bytes -= len(m.tok.Detokenize(ids[start:start+1], false, false))
	}
	if m.ep != nil {
		return m.epPerplexity(ctx, ids, window, step, res)
	}
	s, err := m.NewSession()
	if err != nil {
		return PerplexityResult{}, err
	}
	defer s.Close()
	for start := 0; start+1 < len(ids); start += window {
		win := ids[start:min(start+window, len(ids))]
		err := s.probs(ctx, win, step, func(pos int, p []float32) error {
			if pos+1 < len(win) {
				res.NLL -= math.Log(math.Max(float64(p[win[pos+1]]), 1e-30))
				res.Tokens++
			}
			return nil
		})
		if err != nil {
			return res, err
		}
	}
	res.Perplexity = math.Exp(res.NLL / float64(res.Tokens))
	res.BitsPerByte = res.NLL / math.Ln2 / float64(res.Bytes)
	return res, nil
}
