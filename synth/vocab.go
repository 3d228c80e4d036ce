package synth

import (
	"fmt"
	"strings"
)

// Token types as stored in tokenizer.ggml.token_type (llama.cpp's llama_token_type).
const (
	tokNormal      int32 = 1
	tokUnknown     int32 = 2
	tokControl     int32 = 3
	tokUserDefined int32 = 4
	tokUnused      int32 = 5
	tokByte        int32 = 6
)

// Tokenizer styles, one per family of real models. The style fixes the tokenizer model
// (SentencePiece "llama" or byte-level BPE "gpt2"), the pre-tokenizer name llama.cpp switches
// on, the special tokens and the chat template.
const (
	TokSPM      = "spm"          // Mixtral / Llama 2: SentencePiece with byte fallback, BOS added
	TokQwen2    = "qwen2"        // Qwen1.5 / Qwen2: byte-level BPE, ChatML, no BOS
	TokQwen3    = "qwen3"        // Qwen3: as qwen2 plus <think> tokens
	TokOLMo     = "olmo"         // OLMoE: byte-level BPE with the GPT-2 pre-tokenizer
	TokDeepSeek = "deepseek-llm" // DeepSeek-V2: byte-level BPE, BOS added
)

// vocab is everything that goes under tokenizer.* in the GGUF metadata.
type vocab struct {
	model    string // tokenizer.ggml.model
	pre      string // tokenizer.ggml.pre (BPE only)
	tokens   []string
	types    []int32
	scores   []float32 // SPM only
	merges   []string  // BPE only
	bos, eos int
	unk, pad int // -1 when absent
	addBOS   bool
	template string
}

// words is the corpus the vocabularies are grown from: common English words first (so that
// small vocabularies still tokenize ordinary text into whole words), then words of the domain.
var words = strings.Fields(`
the of and to in is that it for on with as was he be at by this had not are but from or have
an they which one you were all we her she there would their will when who him been has more if
no out so said what up its about than into them can only other new some could time these two
may then do first any my now such like our over man me even most made after also did many
before must through back years where much your way well down should because each just those
people how too little state good very make world still own see men work long get here between
both life being under never day same another know while last might us great old year off come
since against go came right used take three model expert token router layer memory engine
number value weight cache prompt answer question small large fast slow open close read write
data file test print first second third light dark water fire earth stone tree river city
house green blue red white black north south east west morning evening night summer winter
music story paper table window garden market school friend family mother father child
`)

// bytesToUnicode is GPT-2's map from bytes to printable characters, which byte-level BPE
// vocabularies are written in: printable Latin-1 bytes stand for themselves, the rest are
// shifted to U+0100 and up (so a space is "Ġ" and a newline "Ċ"). The order of the returned
// runes is GPT-2's token order for the 256 byte tokens.
func bytesToUnicode() (order []byte, m [256]rune) {
	var printable [256]bool
	for b := '!'; b <= '~'; b++ {
		printable[b] = true
	}
	for b := '¡'; b <= '¬'; b++ {
		printable[b] = true
	}
	for b := '®'; b <= 'ÿ'; b++ {
		printable[b] = true
	}
	n := 0
	for b := 0; b < 256; b++ {
		if printable[b] {
			m[b] = rune(b)
			order = append(order, byte(b))
		}
	}
	for b := 0; b < 256; b++ {
		if !printable[b] {
			m[b] = rune(256 + n)
			n++
			order = append(order, byte(b))
		}
	}
	return order, m
}

func byteLevel(s string, m *[256]rune) string {
	var sb strings.Builder
	for _, b := range []byte(s) {
		sb.WriteRune(m[b])
	}
	return sb.String()
}

// buildVocab makes a vocabulary of exactly n tokens in the given style.
func buildVocab(style string, n int) (*vocab, error) {
	switch style {
	case TokSPM:
		return buildSPM(n)
	case TokQwen2, TokQwen3, TokOLMo, TokDeepSeek:
		return buildBPE(style, n)
	}
	return nil, fmt.Errorf("unknown tokenizer style %q", style)
}

// buildSPM makes a SentencePiece vocabulary laid out like Llama 2's: <unk>, <s>, </s>, the 256
// byte-fallback tokens <0x00>..<0xFF>, then pieces. Pieces are "▁" plus single characters and
// every prefix of every "▁word", so that llama.cpp's bigram merging can build each word from
// its characters; scores decrease with insertion order, which is how SentencePiece ranks them.
func buildSPM(n int) (*vocab, error) {
	v := &vocab{model: "llama", bos: 1, eos: 2, unk: 0, pad: -1, addBOS: true}
	seen := map[string]bool{}
	add := func(tok string, typ int32, score float32) {
		if seen[tok] || len(v.tokens) >= n {
			return
		}
		seen[tok] = true
		v.tokens = append(v.tokens, tok)
		v.types = append(v.types, typ)
		v.scores = append(v.scores, score)
	}
	add("<unk>", tokUnknown, 0)
	add("<s>", tokControl, 0)
	add("</s>", tokControl, 0)
	for b := 0; b < 256; b++ {
		add(fmt.Sprintf("<0x%02X>", b), tokByte, 0)
	}
	piece := 0
	addPiece := func(p string) {
		if !seen[p] {
			piece++
			add(p, tokNormal, -float32(piece))
		}
	}
	addPiece("▁")
	for _, c := range "etaoinshrdlucmfwypvbgkqjxz.,!?'-0123456789ETAOINSHRDLUCMFWYPVBGKQJXZ" {
		addPiece(string(c))
	}
	for _, w := range words {
		p := "▁"
		for _, c := range w {
			p += string(c)
			addPiece(p)
		}
	}
	// Capitalised sentence starts, then inner-word pieces, until the vocabulary is full.
	for _, w := range words {
		p := "▁" + strings.ToUpper(w[:1])
		addPiece(p)
		for _, c := range w[1:] {
			p += string(c)
			addPiece(p)
		}
	}
	// Benchmark models ask for real vocabulary sizes (32000 and more): unused tokens fill the
	// rest, as in real vocabularies, so the embedding and LM head have their real cost.
	for i := 0; len(v.tokens) < n; i++ {
		add(fmt.Sprintf("<unused%d>", i), tokUnused, 0)
	}
	v.template = "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}" +
		"{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}" +
		"{{ message['content'] + eos_token }}{% endif %}{% endfor %}"
	return v, nil
}

// buildBPE makes a byte-level BPE vocabulary: the 256 byte tokens in GPT-2's order, then the
// results of merges learnt left to right over the word list (with and without a leading
// space), then the family's special tokens at the end as in the real vocabularies. Every merge
// result is a token, which llama.cpp needs to map merged symbols back to ids.
func buildBPE(style string, n int) (*vocab, error) {
	v := &vocab{model: "gpt2", pre: style, unk: -1, pad: -1}
	specials, special := v.bpeFamily(style)
	regular := n - len(specials)
	if regular < 256 {
		return nil, fmt.Errorf("bpe vocabulary of %d tokens has no room for the 256 byte tokens", n)
	}
	v.learnMerges(regular)
	for i := 0; len(v.tokens) < regular; i++ {
		v.tokens = append(v.tokens, fmt.Sprintf("<unused%d>", i))
		v.types = append(v.types, tokUnused)
	}
	first := len(v.tokens)
	v.tokens = append(v.tokens, specials...)
	v.types = append(v.types, special...)
	switch style {
	case TokQwen2, TokQwen3:
		v.bos, v.pad, v.eos = first, first, first+2 // <|endoftext|>, <|endoftext|>, <|im_end|>
	case TokOLMo:
		v.pad, v.bos, v.eos = first, first+1, first+1
	case TokDeepSeek:
		v.bos, v.eos, v.pad = first, first+1, first+1
	}
	return v, nil
}

// bpeFamily sets what the style's real vocabularies fix (pre-tokenizer, chat template, BOS)
// and returns their special tokens with their types, which go at the end of the vocabulary.
func (v *vocab) bpeFamily(style string) (specials []string, special []int32) {
	switch style {
	case TokQwen2, TokQwen3:
		v.pre = "qwen2"
		specials = []string{"<|endoftext|>", "<|im_start|>", "<|im_end|>"}
		special = []int32{tokControl, tokControl, tokControl}
		if style == TokQwen3 {
			// Qwen3 marks its reasoning span with added tokens that are not control tokens.
			specials = append(specials, "<think>", "</think>")
			special = append(special, tokUserDefined, tokUserDefined)
		}
		v.template = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + " +
			"message['content'] + '<|im_end|>' + '\n'}}{% endfor %}" +
			"{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
	case TokOLMo:
		specials = []string{"<|padding|>", "<|endoftext|>"}
		special = []int32{tokControl, tokControl}
		v.template = "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'system' %}" +
			"{{ '<|system|>\n' + message['content'] + '\n' }}{% elif message['role'] == 'user' %}" +
			"{{ '<|user|>\n' + message['content'] + '\n' }}{% elif message['role'] == 'assistant' %}" +
			"{{ '<|assistant|>\n' + message['content'] + eos_token + '\n' }}{% endif %}" +
			"{% if loop.last and add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}{% endfor %}"
	case TokDeepSeek:
		specials = []string{"<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"}
		special = []int32{tokControl, tokControl}
		v.addBOS = true
		v.template = "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}" +
			"{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}" +
			"{{ 'User: ' + message['content'] + '\n\n' }}{% elif message['role'] == 'assistant' %}" +
			"{{ 'Assistant: ' + message['content'] + eos_token }}{% elif message['role'] == 'system' %}" +
			"{{ message['content'] + '\n\n' }}{% endif %}{% endfor %}" +
			"{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
	}
	return specials, special
}

// learnMerges adds the 256 byte tokens, then merges learnt over the word list and their
// results as tokens until the vocabulary holds regular tokens or the words run out.
func (v *vocab) learnMerges(regular int) {
	order, m := bytesToUnicode()
	seen := map[string]bool{}
	for _, b := range order {
		tok := string(m[b])
		seen[tok] = true
		v.tokens = append(v.tokens, tok)
		v.types = append(v.types, tokNormal)
	}
	pairs := map[string]bool{}
	learn := func(word string) {
		sym := []rune(word)
		cur := string(sym[0])
		for _, r := range sym[1:] {
			next := cur + string(r)
			pair := cur + " " + string(r)
			if len(v.tokens) >= regular {
				return
			}
			if !pairs[pair] {
				pairs[pair] = true
				v.merges = append(v.merges, pair)
				if !seen[next] {
					seen[next] = true
					v.tokens = append(v.tokens, next)
					v.types = append(v.types, tokNormal)
				}
			}
			cur = next
		}
	}
	// Space-led words first: that is how most words occur in running text.
	for _, w := range words {
		learn(byteLevel(" "+w, &m))
	}
	learn(byteLevel("\n\n", &m))
	for _, w := range words {
		learn(byteLevel(w, &m))
	}
	for _, w := range words {
		learn(byteLevel(" "+strings.ToUpper(w[:1])+w[1:], &m))
	}
}

// kv returns the tokenizer's GGUF metadata.
func (v *vocab) kv() map[string]any {
	kv := map[string]any{
		"tokenizer.ggml.model":         v.model,
		"tokenizer.ggml.tokens":        v.tokens,
		"tokenizer.ggml.token_type":    v.types,
		"tokenizer.ggml.bos_token_id":  uint32(v.bos),
		"tokenizer.ggml.eos_token_id":  uint32(v.eos),
		"tokenizer.ggml.add_bos_token": v.addBOS,
		"tokenizer.ggml.add_eos_token": false,
		"tokenizer.chat_template":      v.template,
	}
	if v.pad >= 0 {
		kv["tokenizer.ggml.padding_token_id"] = uint32(v.pad)
	}
	if v.unk >= 0 {
		kv["tokenizer.ggml.unknown_token_id"] = uint32(v.unk)
	}
	if v.scores != nil {
		kv["tokenizer.ggml.scores"] = v.scores
	}
	if v.model == "gpt2" {
		kv["tokenizer.ggml.pre"] = v.pre
		kv["tokenizer.ggml.merges"] = v.merges
	}
	return kv
}
