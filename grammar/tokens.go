package grammar

import (
	"bytes"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"sync/atomic"
	"unicode/utf8"
)

// Vocab indexes a model's vocabulary for Matchers: built once per model (it costs a sort of
// the vocabulary) and shared by every generation. It is immutable and safe for concurrent use.
//
// A step of a Matcher walks a prefix trie of the tokens' bytes in preorder, carrying the
// recognizer's state down it, so that tokens sharing a prefix share its work and a byte the
// grammar refuses skips the subtree below it at once. Inside a string, where most of the
// vocabulary is allowed, the tokens that are plain text (whole UTF-8 characters, no quote,
// backslash or control character) need no walk: any of them continues a string, by its
// count of characters, so they are allowed from a precomputed set and only the rest of the
// vocabulary is walked.
type Vocab struct {
	size  int
	data  []byte  // every token's bytes
	off   []int32 // token id's bytes are data[off[id]:off[id+1]]
	eog   []int32 // end-of-generation tokens: allowed only after a whole value
	isEOG []bool
	full  trie // every token but the special ones
	rest  trie // the tokens of full that are not plain text
	// markup: the special tokens a text grammar's literals may be written with (Qwen's
	// <tool_call>), allowed outside JSON values only
	markup  trie
	fullIDs []int32 // the tokens of full
	// until[b]: the split of full for raw text up to a delimiter starting with b, built on
	// first use (see untilSplit)
	until [256]atomic.Pointer[untilSplit]
	// plain text tokens: their set and, by id, their characters
	plain      []uint64
	plainIDs   []int32
	plainChars []uint16
	maxPlain   int // the most characters of a plain text token
	maxLen     int
}

// trie is a prefix trie of byte strings in preorder: node i's subtree is [i, end), its
// depth its byte string's length, the byte on the edge to it b, and the tokens whose bytes
// end there ids[tok:tok+ntok]. Node 0 is the root.
type trie struct {
	nodes []trieNode
	ids   []int32
}

type trieNode struct {
	end   int32
	tok   int32
	ntok  uint16
	depth uint16
	b     byte
}

// VocabOption configures NewVocab.
type VocabOption func(*vocabOptions)

type vocabOptions struct{ markup func(id int32) bool }

// Markup lets the special tokens for which markup is true (and that are not end of
// generation) write a text grammar's literals, outside JSON values: a model's tool-call
// markers, which it was trained to write as one token, not spelled out byte by byte.
func Markup(markup func(id int32) bool) VocabOption {
	return func(o *vocabOptions) { o.markup = markup }
}

// NewVocab indexes a vocabulary: pieces[id] is the text token id stands for, as bytes;
// special tokens (special(id) true, or an empty piece) are never allowed, but for the
// end-of-generation tokens eog, which are allowed after a whole value, and those Markup
// names.
func NewVocab(pieces []string, special func(id int32) bool, eog []int32, opts ...VocabOption) *Vocab {
	var o vocabOptions
	for _, opt := range opts {
		opt(&o)
	}
	v := &Vocab{size: len(pieces), off: make([]int32, len(pieces)+1), isEOG: make([]bool, len(pieces)),
		plain: make([]uint64, (len(pieces)+63)/64)}
	for _, id := range eog {
		if id >= 0 && int(id) < len(pieces) && !v.isEOG[id] {
			v.isEOG[id] = true
			v.eog = append(v.eog, id)
		}
	}
	var full, rest, markup []int32
	for id, p := range pieces {
		v.off[id] = int32(len(v.data))
		v.data = append(v.data, p...)
		if p == "" || v.isEOG[id] || len(p) > math.MaxUint16 {
			continue
		}
		if special(int32(id)) {
			if o.markup != nil && o.markup(int32(id)) {
				markup = append(markup, int32(id))
				v.maxLen = max(v.maxLen, len(p))
			}
			continue
		}
		v.maxLen = max(v.maxLen, len(p))
		full = append(full, int32(id))
		if plainText(p) {
			v.plain[id/64] |= 1 << (id % 64)
			v.plainIDs = append(v.plainIDs, int32(id))
			v.plainChars = append(v.plainChars, uint16(utf8.RuneCountInString(p)))
			v.maxPlain = max(v.maxPlain, int(v.plainChars[len(v.plainChars)-1]))
		} else {
			rest = append(rest, int32(id))
		}
	}
	v.off[len(pieces)] = int32(len(v.data))
	v.fullIDs = slices.Clone(full)
	v.full = v.buildTrie(full)
	v.rest = v.buildTrie(rest)
	v.markup = v.buildTrie(markup)
	return v
}

// Size is the vocabulary's size.
func (v *Vocab) Size() int { return v.size }

func (v *Vocab) piece(id int32) []byte { return v.data[v.off[id]:v.off[id+1]] }

// plainText says whether p continues any string by its characters alone.
func plainText(p string) bool {
	for i := 0; i < len(p); i++ {
		if b := p[i]; b < 0x20 || b == '"' || b == '\\' {
			return false
		}
	}
	return utf8.ValidString(p)
}

func (v *Vocab) buildTrie(ids []int32) trie {
	slices.SortFunc(ids, func(a, b int32) int {
		if c := bytes.Compare(v.piece(a), v.piece(b)); c != 0 {
			return c
		}
		return int(a - b)
	})
	t := trie{nodes: []trieNode{{tok: -1}}}
	path := []int32{0} // path[d]: the node at depth d of the previous token
	var prev []byte
	for _, id := range ids {
		p := v.piece(id)
		l := 0
		for l < len(p) && l < len(prev) && p[l] == prev[l] {
			l++
		}
		if l == len(p) && l == len(prev) { // the same bytes as the token before
			t.nodes[path[l]].ntok++
			t.ids = append(t.ids, id)
			continue
		}
		for _, n := range path[l+1:] {
			t.nodes[n].end = int32(len(t.nodes))
		}
		path = path[:l+1]
		for d := l; d < len(p); d++ {
			path = append(path, int32(len(t.nodes)))
			t.nodes = append(t.nodes, trieNode{tok: -1, depth: uint16(d + 1), b: p[d]})
		}
		last := &t.nodes[path[len(p)]]
		last.tok, last.ntok = int32(len(t.ids)), 1
		t.ids = append(t.ids, id)
		prev = p
	}
	for _, n := range path {
		t.nodes[n].end = int32(len(t.nodes))
	}
	return t
}

// Matcher holds one generation to a grammar over a vocabulary: a token filter for package
// sample's chain (Mask, then Accept on the token drawn). It is not safe for concurrent use;
// after its scratch has grown, a token allocates nothing.
type Matcher struct {
	v       *Vocab
	r       *Recognizer
	states  []Recognizer // a trie walk's state at each depth
	allowed []uint64
	ended   bool // an end-of-generation token was accepted
	err     error
}

// NewMatcher starts a generation held to g.
func NewMatcher(v *Vocab, g *Grammar) *Matcher {
	m := &Matcher{v: v, r: g.Recognizer(), states: make([]Recognizer, v.maxLen+1),
		allowed: make([]uint64, len(v.plain))}
	c := g.stackCap()
	frames := make([]frame, len(m.states)*c)
	for i := range m.states {
		m.states[i].stack = frames[i*c : i*c][:0:c]
	}
	return m
}

// Mask sets the logits of the tokens that cannot come next to -Inf, and reports whether any
// token can.
func (m *Matcher) Mask(logits []float32) bool {
	if m.err != nil || m.ended {
		return false
	}
	a := m.allowed
	clear(a)
	top := &m.r.stack[len(m.r.stack)-1]
	if top.kind == fString && top.st == strText {
		n := m.r.nodes[top.n]
		if n.maxLen < 0 || n.maxLen-int(top.cnt) >= m.v.maxPlain {
			copy(a, m.v.plain)
		} else {
			room := n.maxLen - int(top.cnt)
			for i, id := range m.v.plainIDs {
				if int(m.v.plainChars[i]) <= room {
					a[id/64] |= 1 << (id % 64)
				}
			}
		}
		m.walk(&m.v.rest)
	} else if u := m.untilFast(top); u != nil {
		copy(a, u.plain)
		m.walk(&u.rest)
	} else {
		m.walk(&m.v.full)
		if top.kind == fSeq || top.kind == fRepeat || top.kind == fLoop || top.kind == fTop {
			m.walk(&m.v.markup)
		}
	}
	if m.r.Complete() {
		for _, id := range m.v.eog {
			a[id/64] |= 1 << (id % 64)
		}
	}
	any := false
	inf := float32(math.Inf(-1))
	for w, word := range a {
		base := w * 64
		if base >= len(logits) {
			break
		}
		switch word {
		case math.MaxUint64:
			any = true
		case 0:
			// Most words of a structural step: no branch per token.
			l := logits[base:min(base+64, len(logits))]
			for j := range l {
				l[j] = inf
			}
		default:
			any = true
			l := logits[base:min(base+64, len(logits))]
			for z := ^word; z != 0; z &= z - 1 {
				if j := bits.TrailingZeros64(z); j < len(l) {
					l[j] = inf
				}
			}
		}
	}
	for i := len(a) * 64; i < len(logits); i++ {
		logits[i] = inf // beyond the vocabulary (padding rows of the output)
	}
	return any
}

// untilSplit splits the vocabulary for raw text whose delimiter starts with one byte: the
// tokens that are whole UTF-8 without that byte (plain), which continue such text from any
// point where no part of the delimiter is pending, and the rest, walked.
type untilSplit struct {
	plain []uint64
	rest  trie
}

// untilFast is the split for an Until frame on top where it applies: no character or
// delimiter under way, and room left for any token.
func (m *Matcher) untilFast(top *frame) *untilSplit {
	if top.kind != fUntil || top.rem != 0 || top.pos != 0 {
		return nil
	}
	n := m.r.nodes[top.n]
	if n.maxLen-int(top.cnt)-len(n.lits[0]) < m.v.maxLen {
		return nil
	}
	return m.v.untilSplit(n.lits[0][0])
}

// untilSplit builds (once) the split for delimiters starting with b.
func (v *Vocab) untilSplit(b byte) *untilSplit {
	if u := v.until[b].Load(); u != nil {
		return u
	}
	u := &untilSplit{plain: make([]uint64, len(v.plain))}
	var rest []int32
	for _, id := range v.fullIDs {
		p := v.piece(id)
		if utf8.Valid(p) && bytes.IndexByte(p, b) < 0 {
			u.plain[id/64] |= 1 << (id % 64)
		} else {
			rest = append(rest, id)
		}
	}
	u.rest = v.buildTrie(rest)
	v.until[b].CompareAndSwap(nil, u)
	return v.until[b].Load()
}

// walk allows the tokens of t the recognizer accepts.
func (m *Matcher) walk(t *trie) {
	m.states[0].copyFrom(m.r)
	nodes := t.nodes
	for i := 1; i < len(nodes); {
		n := &nodes[i]
		s := &m.states[n.depth]
		s.copyFrom(&m.states[n.depth-1])
		if !s.step(n.b) {
			i = int(n.end)
			continue
		}
		if n.ntok > 0 {
			for _, id := range t.ids[n.tok : n.tok+int32(n.ntok)] {
				m.allowed[id/64] |= 1 << (id % 64)
			}
		}
		i++
	}
}

// Accept advances past token id, which Mask allowed.
func (m *Matcher) Accept(id int32) {
	switch {
	case m.err != nil:
	case id < 0 || int(id) >= m.v.size:
		m.err = fmt.Errorf("grammar: token %d is outside the vocabulary of %d", id, m.v.size)
	case m.v.isEOG[id]:
		if !m.r.Complete() {
			m.err = fmt.Errorf("grammar: end of generation before the value is whole")
		}
		m.ended = true
	default:
		for _, b := range m.v.piece(id) {
			if !m.r.step(b) {
				m.err = fmt.Errorf("grammar: token %d (%q) does not continue the value", id, m.v.piece(id))
				return
			}
		}
	}
}

// Feed advances past text written other than by a token Accept saw (a lazy grammar's
// trigger and what followed it in the same token), and reports whether the grammar accepts
// it; on false the matcher is unchanged.
func (m *Matcher) Feed(text []byte) bool { return m.err == nil && !m.ended && m.r.Feed(text) }

// Err is the first token Accept was given that the grammar refuses.
func (m *Matcher) Err() error { return m.err }

// Complete reports whether the text so far is a whole value.
func (m *Matcher) Complete() bool { return m.err == nil && m.r.Complete() }

// Done reports whether the value is whole and nothing may follow: generation is over.
func (m *Matcher) Done() bool { return m.err == nil && (m.ended || m.r.Done()) }
