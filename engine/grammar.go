package engine

import (
	"errors"
	"runtime"
	"sync"
	"weak"

	"github.com/commit-run/commit-run/grammar"
	"github.com/commit-run/commit-run/tokenizer"
)

// errNoToken: the grammar allows no token of the vocabulary, which lacks the bytes the value
// needs next.
var errNoToken = errors.New("no token of the vocabulary continues the value")

// Grammar vocabularies by tokenizer: indexing one sorts the whole vocabulary, which a
// request should not pay for each time. The entry goes with its tokenizer.
var (
	vocabsMu sync.Mutex
	vocabs   = map[weak.Pointer[tokenizer.Tokenizer]]*grammar.Vocab{}
)

// grammarVocab is the model's vocabulary indexed for package grammar: every token's bytes,
// the special ones never allowed inside a value, the end-of-generation ones after it, and
// the markup ones (control and user-defined) where a text grammar's own text is due.
func (m *Model) grammarVocab() *grammar.Vocab {
	key := weak.Make(m.tok)
	vocabsMu.Lock()
	defer vocabsMu.Unlock()
	if v, ok := vocabs[key]; ok {
		return v
	}
	tok := m.tok
	pieces := make([]string, tok.VocabSize())
	for id := range pieces {
		pieces[id] = tok.TokenText(int32(id))
	}
	v := grammar.NewVocab(pieces, tok.IsSpecial, tok.EOGTokens(), grammar.Markup(tok.IsMarkup))
	vocabs[key] = v
	runtime.AddCleanup(tok, func(k weak.Pointer[tokenizer.Tokenizer]) {
		vocabsMu.Lock()
		delete(vocabs, k)
		vocabsMu.Unlock()
	}, key)
	return v
}
