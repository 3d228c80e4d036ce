// Package tokenizer turns text into token ids and back for the GGUF models
// commit-run serves, matching llama.cpp's tokenizer (llama-vocab.cpp) id for
// id: SentencePiece vocabularies (tokenizer.ggml.model "llama", e.g.
// Mixtral) and byte-level BPE ones ("gpt2": Qwen, OLMoE, DeepSeek) with
// the pre-tokenizer tokenizer.ggml.pre selects. It also renders the
// model's chat template (see RenderChat).
//
// Matching llama.cpp exactly is the point: a model is trained on one
// segmentation and generates worse from another, and comparing logits with
// llama.cpp needs identical prompts. Where llama.cpp's behaviour is odd (the
// space it adds after special tokens in SentencePiece prompts, dropped
// unknown bytes in BPE, the clean-up pass of its detokenizer) this package
// reproduces it; the tests compare against llama.cpp's own ids on real
// vocabularies (see tools/tokgolden).
package tokenizer

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/ollama/ollama/fs/ggml"
)

// GGUF metadata keys read here.
const (
	keyArch         = "general.architecture"
	keyModel        = "tokenizer.ggml.model"
	keyPre          = "tokenizer.ggml.pre"
	keyTokens       = "tokenizer.ggml.tokens"
	keyTokenType    = "tokenizer.ggml.token_type"
	keyScores       = "tokenizer.ggml.scores"
	keyMerges       = "tokenizer.ggml.merges"
	keyAddBOS       = "tokenizer.ggml.add_bos_token"
	keyAddEOS       = "tokenizer.ggml.add_eos_token"
	keyAddPrefix    = "tokenizer.ggml.add_space_prefix"
	keyChatTemplate = "tokenizer.chat_template"
)

// Token attributes, llama.cpp's llama_token_attr bits.
type tokenAttr uint32

const (
	attrUndefined   tokenAttr = 0
	attrUnknown     tokenAttr = 1 << 0
	attrUnused      tokenAttr = 1 << 1
	attrNormal      tokenAttr = 1 << 2
	attrControl     tokenAttr = 1 << 3
	attrUserDefined tokenAttr = 1 << 4
	attrByte        tokenAttr = 1 << 5
)

// GGUF token types (tokenizer.ggml.token_type values).
const (
	typeNormal      = 1
	typeUnknown     = 2
	typeControl     = 3
	typeUserDefined = 4
	typeUnused      = 5
	typeByte        = 6
)

// noToken is llama.cpp's LLAMA_TOKEN_NULL.
const noToken int32 = -1

// Tokenizer encodes and decodes text for one GGUF vocabulary. It is safe for
// concurrent use.
type Tokenizer struct {
	model string // tokenizer.ggml.model: "llama" (SPM) or "gpt2" (BPE)
	pre   string // tokenizer.ggml.pre as found in the file
	arch  string // general.architecture

	tokens  []string
	attrs   []tokenAttr
	scores  []float32
	ids     map[string]int32
	ranks   map[mergePair]int32
	pieces  []string // token_to_piece(id, special=true), as llama.cpp caches it
	special []int32  // control, user-defined and unknown tokens, longest text first

	splitter *preTokenizer

	bos, eos, eot, eom, unk int32
	fim                     fimIDs
	eog                     map[int32]bool

	addBOS, addEOS bool
	addSpacePrefix bool
	ignoreMerges   bool
	cleanSpaces    bool
	chatTemplate   string
	warnings       []string

	capsOnce sync.Once
	caps     ChatCaps
}

type mergePair struct{ left, right string }

// FromGGUF builds a tokenizer from GGUF metadata (what ggml.Decode returns;
// decode with maxArraySize -1 so the vocabulary arrays are kept). Errors name
// the metadata key at fault.
func FromGGUF(kv ggml.KV) (*Tokenizer, error) {
	t := &Tokenizer{bos: noToken, eos: noToken, eot: noToken, eom: noToken, unk: noToken}
	var err error
	if t.arch, _, err = kvString(kv, keyArch); err != nil {
		return nil, err
	}
	model, ok, err := kvString(kv, keyModel)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("tokenizer: %s is missing", keyModel)
	}
	t.model = model
	if t.pre, _, err = kvString(kv, keyPre); err != nil {
		return nil, err
	}

	if err := t.typeDefaults(); err != nil {
		return nil, err
	}
	if v, ok, err := kvBool(kv, keyAddPrefix); err != nil {
		return nil, err
	} else if ok {
		t.addSpacePrefix = v
	}

	if err := t.loadVocab(kv); err != nil {
		return nil, err
	}
	if model == "gpt2" {
		if err := t.loadMerges(kv); err != nil {
			return nil, err
		}
	}
	if err := t.loadSpecialIDs(kv); err != nil {
		return nil, err
	}
	t.detectSpecialTokens()

	t.listSpecial()
	t.pieces = make([]string, len(t.tokens))
	for id := range t.tokens {
		t.pieces[id] = t.renderPiece(int32(id))
	}

	if t.chatTemplate, _, err = kvString(kv, keyChatTemplate); err != nil {
		return nil, err
	}
	return t, nil
}

// typeDefaults sets what each vocabulary type assumes when the metadata is silent, as
// llama.cpp sets it before reading the keys that override it; for BPE that includes the
// pre-tokenizer, which only t.pre names.
func (t *Tokenizer) typeDefaults() error {
	switch t.model {
	case "llama":
		t.bos, t.eos, t.unk = 1, 2, 0
		t.addBOS, t.addSpacePrefix = true, true
	case "gpt2":
		t.bos, t.eos = 11, 11
		t.cleanSpaces = true
		info, err := t.preType()
		if err != nil {
			return err
		}
		t.cleanSpaces = !info.keepSpaces
		t.ignoreMerges = info.ignoreMerges
		t.addBOS = info.addBOS
		if info.noBOS {
			t.bos = noToken
		}
		if t.splitter, err = compilePre(info.set); err != nil {
			return err
		}
	case "":
		return fmt.Errorf("tokenizer: %s is empty", keyModel)
	default:
		return fmt.Errorf("tokenizer: %s %q is not supported (want \"llama\" or \"gpt2\")", keyModel, t.model)
	}
	return nil
}

// preType looks t.pre up among llama.cpp's pre-tokenizers. A missing or unknown name falls
// back to llama.cpp's 'default' with a warning rather than an error, so that such a model
// still loads; a known one this package lacks is an error, as its splitting is known to differ.
func (t *Tokenizer) preType() (preInfo, error) {
	info, known := preTypes[t.pre]
	switch {
	case known:
	case unsupportedPre[t.pre]:
		return info, fmt.Errorf("tokenizer: %s %q is a llama.cpp pre-tokenizer this package does not implement", keyPre, t.pre)
	case t.pre == "":
		t.warnings = append(t.warnings, fmt.Sprintf("%s is missing; using llama.cpp's 'default' pre-tokenizer (tokenization may not match the model's training)", keyPre))
		info = preTypes["default"]
	default:
		t.warnings = append(t.warnings, fmt.Sprintf("%s %q is unknown; using llama.cpp's 'default' pre-tokenizer (tokenization may not match the model's training)", keyPre, t.pre))
		info = preTypes["default"]
	}
	return info, nil
}

// listSpecial collects the tokens encoding must match in the text before anything else is
// split, longest first so that a special token is never cut short by one it starts with.
func (t *Tokenizer) listSpecial() {
	for id, a := range t.attrs {
		if a&(attrControl|attrUserDefined|attrUnknown) != 0 {
			t.special = append(t.special, int32(id))
		}
	}
	// llama.cpp sorts by length only (unstable); ties go to the lower id here
	// so the result does not depend on a sort implementation.
	slices.SortStableFunc(t.special, func(a, b int32) int {
		return cmp.Compare(len(t.tokens[b]), len(t.tokens[a]))
	})
}

// loadVocab reads tokens, types and scores.
func (t *Tokenizer) loadVocab(kv ggml.KV) error {
	tokens, ok, err := kvStrings(kv, keyTokens)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("tokenizer: %s is missing", keyTokens)
	}
	if len(tokens) == 0 {
		return fmt.Errorf("tokenizer: %s is empty", keyTokens)
	}
	if len(tokens) > 1<<31-1 {
		return fmt.Errorf("tokenizer: %s has %d entries, more than int32 ids allow", keyTokens, len(tokens))
	}
	n := len(tokens)
	types, hasTypes, err := kvInts(kv, keyTokenType)
	if err != nil {
		return err
	}
	if hasTypes && len(types) < n {
		return fmt.Errorf("tokenizer: %s has %d entries for %d tokens", keyTokenType, len(types), n)
	}
	scores, hasScores, err := kvFloats(kv, keyScores)
	if err != nil {
		return err
	}
	if hasScores && len(scores) < n {
		return fmt.Errorf("tokenizer: %s has %d entries for %d tokens", keyScores, len(scores), n)
	}

	t.tokens = make([]string, n)
	t.attrs = make([]tokenAttr, n)
	t.scores = make([]float32, n)
	t.ids = make(map[string]int32, n)
	for i, tok := range tokens {
		if tok == "" {
			// llama.cpp renames empty tokens so they stay addressable.
			tok = fmt.Sprintf("[EMPTY_%d]", i)
		}
		if prev, dup := t.ids[tok]; dup {
			// llama.cpp asserts on this (GGML_ASSERT) and aborts.
			return fmt.Errorf("tokenizer: %s has %q at ids %d and %d", keyTokens, tok, prev, i)
		}
		t.ids[tok] = int32(i)
		t.tokens[i] = tok
		if hasScores {
			t.scores[i] = scores[i]
		}
		t.attrs[i] = attrNormal
		if hasTypes {
			switch types[i] {
			case typeNormal:
				t.attrs[i] = attrNormal
			case typeUnknown:
				t.attrs[i] = attrUnknown
			case typeControl:
				t.attrs[i] = attrControl
			case typeUserDefined:
				t.attrs[i] = attrUserDefined
			case typeUnused:
				t.attrs[i] = attrUnused
			case typeByte:
				t.attrs[i] = attrByte
			default:
				t.attrs[i] = attrUndefined
			}
		}
	}
	return nil
}

// loadMerges reads the BPE merge list; a merge's rank is its index.
func (t *Tokenizer) loadMerges(kv ggml.KV) error {
	merges, ok, err := kvStrings(kv, keyMerges)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("tokenizer: %s is missing (required for %s \"gpt2\")", keyMerges, keyModel)
	}
	t.ranks = make(map[mergePair]int32, len(merges))
	for i, m := range merges {
		// llama.cpp splits at the first space after the first byte, so a
		// merge may start with a space; without one it maps "" + "".
		var p mergePair
		if j := strings.IndexByte(m[min(1, len(m)):], ' '); j >= 0 && len(m) > 0 {
			j += min(1, len(m))
			p = mergePair{m[:j], m[j+1:]}
		}
		if _, dup := t.ranks[p]; !dup {
			t.ranks[p] = int32(i)
		}
	}
	return nil
}

// specialKeys are the special-token id keys, in llama.cpp's order (the
// deprecated FIM keys last, so they win as in llama.cpp).
var specialKeys = []string{
	"tokenizer.ggml.bos_token_id",
	"tokenizer.ggml.eos_token_id",
	"tokenizer.ggml.eot_token_id",
	"tokenizer.ggml.eom_token_id",
	"tokenizer.ggml.unknown_token_id",
	"tokenizer.ggml.seperator_token_id",
	"tokenizer.ggml.padding_token_id",
	"tokenizer.ggml.mask_token_id",
	"tokenizer.ggml.fim_pre_token_id",
	"tokenizer.ggml.fim_suf_token_id",
	"tokenizer.ggml.fim_mid_token_id",
	"tokenizer.ggml.fim_pad_token_id",
	"tokenizer.ggml.fim_rep_token_id",
	"tokenizer.ggml.fim_sep_token_id",
	"tokenizer.ggml.prefix_token_id",
	"tokenizer.ggml.suffix_token_id",
	"tokenizer.ggml.middle_token_id",
}

// fimIDs holds the fill-in-the-middle ids while loading: llama.cpp counts
// some of them as end-of-generation.
type fimIDs struct{ pre, suf, mid, pad, rep, sep int32 }

func (t *Tokenizer) loadSpecialIDs(kv ggml.KV) error {
	n := int64(len(t.tokens))
	var fim = fimIDs{noToken, noToken, noToken, noToken, noToken, noToken}
	var sep, pad, mask = noToken, noToken, noToken
	targets := map[string]*int32{
		specialKeys[0]: &t.bos, specialKeys[1]: &t.eos, specialKeys[2]: &t.eot, specialKeys[3]: &t.eom,
		specialKeys[4]: &t.unk, specialKeys[5]: &sep, specialKeys[6]: &pad, specialKeys[7]: &mask,
		specialKeys[8]: &fim.pre, specialKeys[9]: &fim.suf, specialKeys[10]: &fim.mid,
		specialKeys[11]: &fim.pad, specialKeys[12]: &fim.rep, specialKeys[13]: &fim.sep,
		specialKeys[14]: &fim.pre, specialKeys[15]: &fim.suf, specialKeys[16]: &fim.mid,
	}
	for _, key := range specialKeys {
		id := targets[key]
		if *id >= 0 && int64(*id) >= n {
			*id = noToken // a default id past a small vocabulary is no token
		}
		v, ok, err := kvInt(kv, key)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		if v < 0 || v >= n {
			return fmt.Errorf("tokenizer: %s = %d is out of range (vocabulary has %d tokens)", key, v, n)
		}
		*id = int32(v)
	}
	if v, ok, err := kvBool(kv, keyAddBOS); err != nil {
		return err
	} else if ok {
		t.addBOS = v
	}
	if v, ok, err := kvBool(kv, keyAddEOS); err != nil {
		return err
	} else if ok {
		t.addEOS = v
	}
	t.fim = fim
	return nil
}

// detectSpecialTokens reproduces llama.cpp's text-based detection of EOT,
// EOM and FIM tokens and its end-of-generation set. Tokens found this way
// become control tokens (so they are matched verbatim in special parsing
// and hidden when rendering without specials), as in llama.cpp.
func (t *Tokenizer) detectSpecialTokens() {
	find := func(id *int32, texts ...string) {
		if *id != noToken {
			return
		}
		// llama.cpp walks a hash map and keeps the first hit; the first
		// text of the list present in the vocabulary is the deterministic
		// equivalent (they only differ for vocabularies holding several).
		for _, s := range texts {
			if i, ok := t.ids[s]; ok {
				*id = i
				t.attrs[i] |= attrControl
				return
			}
		}
	}
	find(&t.eot, "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
		"<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>")
	find(&t.eom, "<|eom_id|>")
	find(&t.fim.pre, "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>", "<|prefix|>")
	find(&t.fim.suf, "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>", "<|suffix|>")
	find(&t.fim.mid, "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>", "<|middle|>")
	find(&t.fim.pad, "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]")
	find(&t.fim.rep, "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")
	find(&t.fim.sep, "<|file_sep|>")

	// Control tokens named "unused" are unused (Gemma-style vocabularies).
	for i, a := range t.attrs {
		if a&attrControl != 0 && strings.Contains(t.tokens[i], "unused") {
			t.attrs[i] |= attrUnused
		}
	}

	t.eog = map[int32]bool{}
	for _, id := range []int32{t.fim.pad, t.fim.rep, t.fim.sep} {
		if id != noToken {
			t.eog[id] = true
		}
	}
	for _, s := range eogTexts {
		if id, ok := t.ids[s]; ok {
			t.eog[id] = true
			t.attrs[id] |= attrControl
		}
	}
	// gpt-oss: these must always render, so llama.cpp makes them user-defined.
	for _, s := range []string{"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"} {
		if id, ok := t.ids[s]; ok {
			t.attrs[id] = attrUserDefined
		}
	}
	for _, id := range []int32{t.eos, t.eot, t.eom} {
		if id != noToken {
			t.eog[id] = true
		}
	}
	has := func(s string) (int32, bool) {
		id, ok := t.ids[s]
		return id, ok && t.eog[id]
	}
	// o200k_harmony / solar-open: <|end|> ends a message, not generation.
	_, ret := has("<|return|>")
	_, call := has("<|call|>")
	_, calls := has("<|calls|>")
	_, flush := has("<|flush|>")
	if end, ok := has("<|end|>"); ok && ((ret && (call || calls)) || ((call || calls) && flush)) {
		delete(t.eog, end)
		t.attrs[end] = attrUserDefined
	}
	// gemma4 / paddleocr: </s> is not end-of-generation next to <|tool_response>.
	if _, ok := has("<|tool_response>"); ok {
		if s, ok := has("</s>"); ok {
			delete(t.eog, s)
			t.attrs[s] = attrNormal
		}
	}
}

// eogTexts are the token texts llama.cpp treats as end of generation.
var eogTexts = []string{
	"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
	"<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
	"<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
	"<｜end▁of▁sentence｜>", "[e~[",
}

// VocabSize is the number of tokens.
func (t *Tokenizer) VocabSize() int { return len(t.tokens) }

// BOS returns the beginning-of-sequence id and whether the vocabulary has one.
func (t *Tokenizer) BOS() (int32, bool) { return t.bos, t.bos != noToken }

// EOS returns the end-of-sequence id, or -1 if there is none.
func (t *Tokenizer) EOS() int32 { return t.eos }

// AddBOS reports whether Encode with addSpecial prepends BOS.
func (t *Tokenizer) AddBOS() bool { return t.addBOS }

// AddEOS reports whether Encode with addSpecial appends EOS.
func (t *Tokenizer) AddEOS() bool { return t.addEOS }

// IsEOG reports whether id ends generation: EOS, EOT, EOM, <|im_end|>,
// <|endoftext|> and the other tokens llama.cpp's end-of-generation set holds.
func (t *Tokenizer) IsEOG(id int32) bool { return t.eog[id] }

// IsSpecial reports whether id is a control, user-defined, unknown or unused token: one
// that stands for markup rather than text, which a grammar never lets into a value.
func (t *Tokenizer) IsSpecial(id int32) bool {
	if id < 0 || int(id) >= len(t.attrs) {
		return true
	}
	return t.attrs[id]&(attrControl|attrUserDefined|attrUnknown|attrUnused) != 0
}

// IsMarkup reports whether id is a control or user-defined token: markup a chat format
// writes (Qwen's <tool_call>, Mistral's [TOOL_CALLS]), which a grammar may let a model
// write where the format's own text is due.
func (t *Tokenizer) IsMarkup(id int32) bool {
	if id < 0 || int(id) >= len(t.attrs) {
		return false
	}
	return t.attrs[id]&(attrControl|attrUserDefined) != 0
}

// EOGTokens lists the end-of-generation ids in ascending order.
func (t *Tokenizer) EOGTokens() []int32 {
	ids := make([]int32, 0, len(t.eog))
	for id := range t.eog {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// Model is tokenizer.ggml.model: "llama" (SentencePiece) or "gpt2" (BPE).
func (t *Tokenizer) Model() string { return t.model }

// Pre is tokenizer.ggml.pre as found in the file ("" if absent).
func (t *Tokenizer) Pre() string { return t.pre }

// Architecture is general.architecture.
func (t *Tokenizer) Architecture() string { return t.arch }

// Warnings lists problems that did not stop loading, such as an unknown
// pre-tokenizer replaced by llama.cpp's default one.
func (t *Tokenizer) Warnings() []string { return slices.Clone(t.warnings) }

// TokenID returns the id of a token's exact vocabulary text.
func (t *Tokenizer) TokenID(text string) (int32, bool) {
	id, ok := t.ids[text]
	return id, ok
}
