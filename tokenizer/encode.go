package tokenizer

import (
	"container/heap"
	"fmt"
	"strings"
)

// fragment is a run of raw text (tok == noToken) or one special token that
// special-token partitioning cut out of the input.
type fragment struct {
	tok      int32
	off, len int
}

// Encode tokenizes text like llama.cpp's llama_tokenize. addSpecial adds
// BOS/EOS as the vocabulary's add_bos_token/add_eos_token say. parseSpecial
// lets control tokens written in the text (e.g. "<|im_end|>") become their
// ids; user-defined tokens are always matched verbatim, as in llama.cpp.
func (t *Tokenizer) Encode(text string, addSpecial, parseSpecial bool) ([]int32, error) {
	var frags []fragment
	if text != "" {
		frags = t.partition(text, parseSpecial)
	}
	var out []int32
	if addSpecial && t.addBOS {
		if t.bos == noToken {
			return nil, fmt.Errorf("tokenizer: add_bos_token is set but the vocabulary has no BOS token")
		}
		out = append(out, t.bos)
	}
	switch t.model {
	case "llama":
		// llama.cpp prefixes a space to the first text and to text after any
		// special token, so "<s>Hi" encodes "Hi" as "▁Hi".
		prevSpecial := true
		for _, f := range frags {
			if f.tok != noToken {
				out = append(out, f.tok)
				prevSpecial = true
				continue
			}
			s := text[f.off : f.off+f.len]
			if t.addSpacePrefix && prevSpecial {
				s = " " + s
			}
			var err error
			if out, err = t.spm(strings.ReplaceAll(s, " ", "\u2581"), out); err != nil {
				return nil, err
			}
			prevSpecial = false
		}
	default:
		for _, f := range frags {
			if f.tok != noToken {
				out = append(out, f.tok)
				continue
			}
			words, err := t.splitter.split(text[f.off : f.off+f.len])
			if err != nil {
				return nil, err
			}
			for _, w := range words {
				out = t.bpe(w, out)
			}
		}
	}
	if addSpecial && t.addEOS {
		if t.eos == noToken {
			return nil, fmt.Errorf("tokenizer: add_eos_token is set but the vocabulary has no EOS token")
		}
		out = append(out, t.eos)
	}
	return out, nil
}

// partition cuts special tokens out of text, longest first, like
// llama.cpp's tokenizer_st_partition. Without parseSpecial only
// user-defined tokens are cut (Hugging Face does the same).
func (t *Tokenizer) partition(text string, parseSpecial bool) []fragment {
	frags := []fragment{{tok: noToken, off: 0, len: len(text)}}
	var next []fragment
	for _, id := range t.special {
		if !parseSpecial && t.attrs[id]&(attrControl|attrUnknown) != 0 {
			continue
		}
		s := t.tokens[id]
		next = next[:0]
		changed := false
		for _, f := range frags {
			if f.tok != noToken {
				next = append(next, f)
				continue
			}
			off, end := f.off, f.off+f.len
			for off < end {
				i := strings.Index(text[off:end], s)
				if i < 0 {
					break
				}
				changed = true
				if i > 0 {
					next = append(next, fragment{tok: noToken, off: off, len: i})
				}
				next = append(next, fragment{tok: id})
				off += i + len(s)
			}
			if off < end {
				next = append(next, fragment{tok: noToken, off: off, len: end - off})
			}
		}
		if changed {
			frags, next = next, frags
		}
	}
	return frags
}

// symbol is a span of the word being merged, linked to its neighbours.
type symbol struct {
	prev, next int
	off, n     int
}

type bpeBigram struct {
	left, right int
	text        string
	rank        int32
}

// bpeQueue pops the lowest rank first, then the leftmost, as llama.cpp's
// llm_bigram_bpe comparator does.
type bpeQueue []bpeBigram

func (q bpeQueue) Len() int { return len(q) }
func (q bpeQueue) Less(i, j int) bool {
	return q[i].rank < q[j].rank || (q[i].rank == q[j].rank && q[i].left < q[j].left)
}
func (q bpeQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *bpeQueue) Push(x any)   { *q = append(*q, x.(bpeBigram)) }
func (q *bpeQueue) Pop() any {
	old := *q
	x := old[len(old)-1]
	*q = old[:len(old)-1]
	return x
}

// bpe merges one byte-level pre-token and appends its ids
// (llm_tokenizer_bpe_session::tokenize).
func (t *Tokenizer) bpe(word string, out []int32) []int32 {
	if word == "" {
		return out
	}
	var syms []symbol
	if _, whole := t.ids[word]; t.ignoreMerges && whole {
		syms = []symbol{{prev: -1, next: -1, off: 0, n: len(word)}}
	} else {
		for off := 0; off < len(word); {
			n := min(utf8SeqLen(word[off]), len(word)-off)
			next := len(syms) + 1
			if off+n == len(word) {
				next = -1
			}
			syms = append(syms, symbol{prev: len(syms) - 1, next: next, off: off, n: n})
			off += n
		}
	}
	text := func(s symbol) string { return word[s.off : s.off+s.n] }

	var q bpeQueue
	add := func(l, r int) {
		if l < 0 || r < 0 {
			return
		}
		lt, rt := text(syms[l]), text(syms[r])
		rank, ok := t.ranks[mergePair{lt, rt}]
		if !ok {
			return
		}
		heap.Push(&q, bpeBigram{left: l, right: r, text: lt + rt, rank: rank})
	}
	for i := 1; i < len(syms); i++ {
		add(i-1, i)
	}
	for q.Len() > 0 {
		b := heap.Pop(&q).(bpeBigram)
		l, r := &syms[b.left], &syms[b.right]
		if l.n == 0 || r.n == 0 || text(*l)+text(*r) != b.text {
			continue // outdated: one side was merged since
		}
		l.n += r.n
		r.n = 0
		l.next = r.next
		if r.next >= 0 {
			syms[r.next].prev = b.left
		}
		add(l.prev, b.left)
		add(b.left, l.next)
	}

	for _, s := range syms {
		if s.n == 0 {
			continue
		}
		if id, ok := t.ids[text(s)]; ok {
			out = append(out, id)
			continue
		}
		// Not in the vocabulary: llama.cpp looks each byte of the encoded
		// text up as a one-byte token and drops the ones it cannot find.
		str := text(s)
		for j := 0; j < len(str); j++ {
			if id, ok := t.ids[str[j:j+1]]; ok {
				out = append(out, id)
			}
		}
	}
	return out
}

type spmBigram struct {
	left, right int
	score       float32
	size        int
}

// spmQueue pops the highest score first, then the leftmost
// (llm_bigram_spm's comparator).
type spmQueue []spmBigram

func (q spmQueue) Len() int { return len(q) }
func (q spmQueue) Less(i, j int) bool {
	return q[i].score > q[j].score || (q[i].score == q[j].score && q[i].left < q[j].left)
}
func (q spmQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *spmQueue) Push(x any)   { *q = append(*q, x.(spmBigram)) }
func (q *spmQueue) Pop() any {
	old := *q
	x := old[len(old)-1]
	*q = old[:len(old)-1]
	return x
}

// spm tokenizes whitespace-escaped text with SentencePiece's greedy
// highest-score merging, resegmenting pieces that are not tokens into the
// two pieces they were merged from, and finally into byte tokens
// (llm_tokenizer_spm_session).
func (t *Tokenizer) spm(text string, out []int32) ([]int32, error) {
	var syms []symbol
	for off := 0; off < len(text); {
		n := min(utf8SeqLen(text[off]), len(text)-off)
		next := len(syms) + 1
		if off+n == len(text) {
			next = -1
		}
		syms = append(syms, symbol{prev: len(syms) - 1, next: next, off: off, n: n})
		off += n
	}
	if len(syms) == 0 {
		return out, nil
	}
	revMerge := map[string][2]int{}
	var q spmQueue
	add := func(l, r int) {
		if l < 0 || r < 0 {
			return
		}
		s := text[syms[l].off : syms[l].off+syms[l].n+syms[r].n]
		id, ok := t.ids[s]
		if !ok {
			return
		}
		heap.Push(&q, spmBigram{left: l, right: r, score: t.scores[id], size: len(s)})
		revMerge[s] = [2]int{l, r}
	}
	for i := 1; i < len(syms); i++ {
		add(i-1, i)
	}
	for q.Len() > 0 {
		b := heap.Pop(&q).(spmBigram)
		l, r := &syms[b.left], &syms[b.right]
		if l.n == 0 || r.n == 0 || l.n+r.n != b.size {
			continue
		}
		l.n += r.n
		r.n = 0
		l.next = r.next
		if r.next >= 0 {
			syms[r.next].prev = b.left
		}
		add(l.prev, b.left)
		add(b.left, l.next)
	}

	var err error
	var resegment func(s symbol, depth int)
	resegment = func(s symbol, depth int) {
		piece := text[s.off : s.off+s.n]
		if id, ok := t.ids[piece]; ok {
			out = append(out, id)
			return
		}
		// revMerge is keyed by text and the symbols it points at may have
		// grown since; depth bounds what a hostile vocabulary could loop on.
		if p, ok := revMerge[piece]; ok && depth < len(syms) {
			resegment(syms[p[0]], depth+1)
			resegment(syms[p[1]], depth+1)
			return
		}
		for j := 0; j < len(piece); j++ {
			id, e := t.byteToken(piece[j])
			if e != nil && err == nil {
				err = e
			}
			out = append(out, id)
		}
	}
	for i := 0; i != -1; i = syms[i].next {
		resegment(syms[i], 0)
	}
	if err != nil {
		return nil, err
	}
	return out, nil
}

// byteToken is SentencePiece byte fallback: <0xXX>, else the byte itself as
// a token; llama.cpp throws when neither exists.
func (t *Tokenizer) byteToken(b byte) (int32, error) {
	if id, ok := t.ids[fmt.Sprintf("<0x%02X>", b)]; ok {
		return id, nil
	}
	if id, ok := t.ids[string([]byte{b})]; ok {
		return id, nil
	}
	return noToken, fmt.Errorf("tokenizer: no byte-fallback token <0x%02X> in the vocabulary", b)
}
