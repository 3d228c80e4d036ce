package grammar

import (
	"runtime"
	"sync"
	"weak"

	"github.com/commit-run/commit-run/tokenizer"
)

// Vocabularies by tokenizer: indexing one sorts the whole vocabulary, which a generation
// should not pay for each time. An entry goes with its tokenizer.
var (
	vocabsMu sync.Mutex
	vocabs   = map[weak.Pointer[tokenizer.Tokenizer]]*Vocab{}
)

// TokenizerVocab is tok's vocabulary indexed for Matchers, built once per tokenizer: every
// token's bytes as the model writes them, the special ones never allowed inside a value,
// the end-of-generation ones after it, and the markup ones (control and user-defined)
// where a text grammar's own text is due.
func TokenizerVocab(tok *tokenizer.Tokenizer) *Vocab {
	key := weak.Make(tok)
	vocabsMu.Lock()
	defer vocabsMu.Unlock()
	if v, ok := vocabs[key]; ok {
		return v
	}
	pieces := make([]string, tok.VocabSize())
	for id := range pieces {
		pieces[id] = tok.TokenText(int32(id))
	}
	v := NewVocab(pieces, tok.IsSpecial, tok.EOGTokens(), Markup(tok.IsMarkup))
	vocabs[key] = v
	runtime.AddCleanup(tok, func(k weak.Pointer[tokenizer.Tokenizer]) {
		vocabsMu.Lock()
		delete(vocabs, k)
		vocabsMu.Unlock()
	}, key)
	return v
}
