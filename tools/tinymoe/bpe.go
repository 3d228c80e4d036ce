package tinymoe

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/ollama/ollama/fs/ggml"

	"github.com/commit-run/commit-run/tokenizer"
)

// Pre is the pre-tokenizer of the bundled vocabularies: GPT-2's, which every byte-level BPE
// implementation (llama.cpp's included) knows by this name.
const Pre = "gpt-2"

// EndOfText is the one special token. Training never sees it; it is the EOS a chat stops on.
const EndOfText = "<|endoftext|>"

// Vocab is a byte-level BPE vocabulary: 256 byte tokens in GPT-2's order, one token per merge
// in the order learnt, then EndOfText.
type Vocab struct {
	Tokens []string
	Merges []string // "left right", rank = index
}

// EOS is the id of EndOfText.
func (v *Vocab) EOS() int { return len(v.Tokens) - 1 }

// KV returns the tokenizer.* metadata of the vocabulary, as llama.cpp reads it.
func (v *Vocab) KV() ggml.KV {
	types := make([]int32, len(v.Tokens))
	for i := range types {
		types[i] = 1 // normal
	}
	types[v.EOS()] = 3 // control
	return ggml.KV{
		"tokenizer.ggml.model":         "gpt2",
		"tokenizer.ggml.pre":           Pre,
		"tokenizer.ggml.tokens":        v.Tokens,
		"tokenizer.ggml.token_type":    types,
		"tokenizer.ggml.merges":        v.Merges,
		"tokenizer.ggml.bos_token_id":  uint32(v.EOS()),
		"tokenizer.ggml.eos_token_id":  uint32(v.EOS()),
		"tokenizer.ggml.add_bos_token": false,
		"tokenizer.ggml.add_eos_token": false,
	}
}

// Tokenizer builds the engine's tokenizer for the vocabulary.
func (v *Vocab) Tokenizer() (*tokenizer.Tokenizer, error) {
	kv := v.KV()
	kv["general.architecture"] = "llama"
	return tokenizer.FromGGUF(kv)
}

// byteOrder returns GPT-2's byte-to-character map and the order of its 256 byte tokens.
func byteOrder() (order []byte, enc [256]rune) {
	printable := func(b int) bool {
		return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)
	}
	n := 0
	for b := 0; b < 256; b++ {
		if printable(b) {
			enc[b] = rune(b)
			order = append(order, byte(b))
		}
	}
	for b := 0; b < 256; b++ {
		if !printable(b) {
			enc[b] = rune(256 + n)
			n++
			order = append(order, byte(b))
		}
	}
	return order, enc
}

type pair struct{ a, b int32 }

// TrainBPE learns size-257 merges on text (size counts the byte tokens and EndOfText). Each
// step merges the most frequent adjacent pair inside the pre-tokenized words; ties go to the
// pair whose tokens come first in the vocabulary, so the result depends on the text alone.
func TrainBPE(text string, size int) (*Vocab, error) {
	if size < 257 {
		return nil, fmt.Errorf("bpe: vocabulary size %d is below 257 (256 bytes and %s)", size, EndOfText)
	}
	pieces, err := tokenizer.PreTokenize(Pre, text)
	if err != nil {
		return nil, fmt.Errorf("bpe: %w", err)
	}
	v, idOf := byteVocab()
	c, err := countWords(pieces, idOf)
	if err != nil {
		return nil, err
	}
	for len(v.Tokens) < size-1 {
		best, bestN := c.mostFrequent()
		if bestN < 2 {
			break // nothing left worth merging
		}
		id := int32(len(v.Tokens))
		v.Tokens = append(v.Tokens, v.Tokens[best.a]+v.Tokens[best.b])
		v.Merges = append(v.Merges, v.Tokens[best.a]+" "+v.Tokens[best.b])
		c.merge(best, id)
	}
	if slices.Contains(v.Tokens, EndOfText) {
		return nil, fmt.Errorf("bpe: a learnt token spells %s", EndOfText)
	}
	v.Tokens = append(v.Tokens, EndOfText)
	return v, nil
}

// byteVocab starts a vocabulary with the 256 byte tokens, and returns the map from a token's
// text to its id that turns pre-tokenized words into id sequences.
func byteVocab() (*Vocab, map[string]int32) {
	order, enc := byteOrder()
	v := &Vocab{}
	idOf := map[string]int32{}
	for _, b := range order {
		s := string(enc[b])
		idOf[s] = int32(len(v.Tokens))
		v.Tokens = append(v.Tokens, s)
	}
	return v, idOf
}

// wordCounts is the corpus as training sees it: each unique word once, as token ids, with
// how often it occurs, and for each adjacent pair its weighted count and the words that hold
// it, so that a merge revisits only those words instead of the whole corpus.
type wordCounts struct {
	words     [][]int32
	counts    []int
	pairCount map[pair]int
	where     map[pair]map[int]struct{}
}

// countWords gathers the unique pieces in sorted order, so that word indices, and with them
// the order merges rewrite words in, do not depend on map iteration.
func countWords(pieces []string, idOf map[string]int32) (*wordCounts, error) {
	freq := map[string]int{}
	for _, p := range pieces {
		freq[p]++
	}
	keys := make([]string, 0, len(freq))
	for k := range freq {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	c := &wordCounts{words: make([][]int32, len(keys)), counts: make([]int, len(keys)),
		pairCount: map[pair]int{}, where: map[pair]map[int]struct{}{}}
	for i, k := range keys {
		for _, r := range k {
			id, ok := idOf[string(r)]
			if !ok {
				return nil, fmt.Errorf("bpe: pre-tokenizer produced %q outside the byte alphabet", r)
			}
			c.words[i] = append(c.words[i], id)
		}
		c.counts[i] = freq[k]
	}
	for w := range c.words {
		c.addWord(w, 1)
	}
	return c, nil
}

// addWord adds word w's pairs to the counts (sign 1) or takes them out (sign -1). Taking out
// leaves w in where: a merge that finds a word no longer holding its pair rewrites it to itself.
func (c *wordCounts) addWord(w int, sign int) {
	ids := c.words[w]
	for j := 0; j+1 < len(ids); j++ {
		p := pair{ids[j], ids[j+1]}
		c.pairCount[p] += sign * c.counts[w]
		if sign > 0 {
			s := c.where[p]
			if s == nil {
				s = map[int]struct{}{}
				c.where[p] = s
			}
			s[w] = struct{}{}
		}
	}
}

// mostFrequent breaks ties by token ids so that map iteration order cannot pick the merge.
func (c *wordCounts) mostFrequent() (best pair, bestN int) {
	for p, n := range c.pairCount {
		if n > bestN || (n == bestN && n > 0 && cmp.Or(cmp.Compare(p.a, best.a), cmp.Compare(p.b, best.b)) < 0) {
			best, bestN = p, n
		}
	}
	return best, bestN
}

// merge rewrites every word holding best with the new token id, in word order, and drops
// the pairs no word holds any more so that mostFrequent scans only live ones.
func (c *wordCounts) merge(best pair, id int32) {
	ws := make([]int, 0, len(c.where[best]))
	for w := range c.where[best] {
		ws = append(ws, w)
	}
	slices.Sort(ws)
	for _, w := range ws {
		c.addWord(w, -1)
		ids := c.words[w]
		out := ids[:0]
		for j := 0; j < len(ids); j++ {
			if j+1 < len(ids) && ids[j] == best.a && ids[j+1] == best.b {
				out = append(out, id)
				j++
				continue
			}
			out = append(out, ids[j])
		}
		c.words[w] = out
		c.addWord(w, 1)
	}
	delete(c.pairCount, best)
	delete(c.where, best)
	for p, n := range c.pairCount {
		if n == 0 {
			delete(c.pairCount, p)
		}
	}
}
