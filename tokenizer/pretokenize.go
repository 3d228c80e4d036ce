package tokenizer

import (
	"fmt"
	"strings"
	"sync"

	"github.com/dlclark/regexp2"
)

// The regular expressions below are llama.cpp's (llm_tokenizer_bpe in
// llama-vocab.cpp), written as Go interpreted strings with the same escapes
// as the C++ literals, so the strings are byte-identical: llama.cpp picks
// its hand-written splitters by comparing the regex text, and so do we.
const (
	reGPT2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"

	reLlama3 = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
	// reLlama3CI is the original case-insensitive form llama.cpp also routes
	// to its hand-written llama3 splitter.
	reLlama3CI = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
	reQwen2    = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
	reQwen35   = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
	reNewlines = "[^\\n]+|[\\n]+"
	reAyaDigit = "\\d{1,3}(?=(?:\\d{3})*\\b)"

	reDeepseekLetters = "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+"
	reDeepseekPunct   = "\\s?[!-/:-~！-／：-～‘-‟　-。]+"
	reDeepseekCJK     = "[一-龥ࠀ-一가-퟿]+"

	reDeepseek3 = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"
	rePoro      = " ?[^(\\s|.,!?…。，、।۔،)]+"
	reGPT4o     = "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
)

// regexSets are llama.cpp's regex sequences per pre-tokenizer family; each
// regex further splits the pieces the previous ones produced.
var regexSets = map[string][]string{
	"default": {
		"[\\p{P}\\$\\+<=>\\^~\\|]+",
		reGPT2,
		"\\p{N}+",
		"[0-9][0-9][0-9]",
	},
	"gpt2":   {reGPT2},
	"llama3": {reLlama3},
	"jais2": {
		"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s{512}(?!\\S)|\\s{256}(?!\\S)|\\s{128}(?!\\S)|\\s{64}(?!\\S)|\\s{32}(?!\\S)|\\s{16}(?!\\S)|\\s{8}(?!\\S)|\\s{4}(?!\\S)|\\s{1,2}(?!\\S)|\\s{1}",
	},
	// DeepSeek LLM (V1, V2, V2-Lite): CR/LF isolated, then letter runs from an
	// explicit class, punctuation runs, trailing whitespace, CJK and Hangul
	// runs, digit runs.
	"deepseek-llm": {
		"[\r\n]",
		reDeepseekLetters,
		reDeepseekPunct,
		"\\s+$",
		reDeepseekCJK,
		"\\p{N}+",
	},
	"deepseek3": {
		"\\p{N}{1,3}",
		"[一-龥぀-ゟ゠-ヿ]+",
		reDeepseek3,
	},
	"spark2_5": {
		"\\p{N}{1,3}",
		"[一-龥぀-ゟ゠-ヿ]+",
		"[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+|[\r\n]|\\s+(?!\\S)|\\s+",
		"\\p{N}",
	},
	"youtu": {
		"[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+",
		"[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
	},
	"deepseek-coder": {
		"[\r\n]",
		"\\s?\\p{L}+",
		"\\s?\\p{P}+",
		reDeepseekCJK,
		"\\p{N}",
	},
	"falcon": {
		"[\\p{P}\\$\\+<=>\\^~\\|`]+",
		reGPT2,
		"[0-9][0-9][0-9]",
	},
	"starcoder": {
		"\\p{N}",
		reGPT2,
	},
	"qwen2":  {reQwen2},
	"qwen35": {reQwen35},
	"poro":   {rePoro},
	"viking": {rePoro, "\\p{N}"},
	"tekken": {
		"[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
	},
	"chameleon": {
		"<sentinel:[0-9]+>",
		"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
		"([\\t\\n]|    |  )",
		"\\p{N}",
		"[\\p{P}!-/:-@\\[-`{-~]",
		reGPT2,
	},
	"gpt4o": {reGPT4o},
	"granite-emb-multi": {
		"[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))*((?=[\\p{L}\\p{M}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))+((?=[\\p{L}\\p{M}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
	},
	"tiny-aya": {
		reAyaDigit,
		"[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
	},
	"bailingmoe": {
		"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
	},
	"seed-coder": {
		"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
	},
	"ufakzeka": {
		"[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
	},
	"laguna": {reNewlines, reQwen2},
	"exaone-moe": {
		"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
	},
	"minicpm5": {
		"\\p{N}{1,3}",
		"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
	},
}

// preInfo is what a tokenizer.ggml.pre value selects in llama.cpp: a regex
// set and a few tokenizer flags.
type preInfo struct {
	set          string // key into regexSets
	keepSpaces   bool   // clean_spaces = false: Detokenize leaves " ," etc. alone
	ignoreMerges bool   // a whole pre-token found in the vocabulary is one token
	addBOS       bool   // add_bos default (the GGUF key still wins)
	noBOS        bool   // BOS id defaults to none (GLM)
}

// preTypes maps every tokenizer.ggml.pre value llama.cpp accepts for
// byte-level BPE vocabularies that this package implements.
var preTypes = func() map[string]preInfo {
	m := map[string]preInfo{}
	add := func(info preInfo, names ...string) {
		for _, n := range names {
			m[n] = info
		}
	}
	add(preInfo{set: "default"}, "default")
	add(preInfo{set: "llama3", ignoreMerges: true, addBOS: true},
		"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano")
	add(preInfo{set: "minicpm5", ignoreMerges: true}, "minicpm5")
	add(preInfo{set: "deepseek-llm", keepSpaces: true}, "deepseek-llm")
	add(preInfo{set: "deepseek-coder", keepSpaces: true}, "deepseek-coder")
	add(preInfo{set: "deepseek3", keepSpaces: true}, "deepseek-v3", "hunyuan-dense", "hy_v4", "joyai-llm")
	add(preInfo{set: "spark2_5", keepSpaces: true}, "spark2_5")
	add(preInfo{set: "youtu", keepSpaces: true, ignoreMerges: true}, "youtu")
	add(preInfo{set: "falcon"}, "falcon")
	add(preInfo{set: "gpt2"}, "mpt", "gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de",
		"a.x-4.0", "mellum", "modern-bert", "jina-v1-en", "jina-v2-code", "roberta-bpe", "olmo", "jais", "exaone4")
	add(preInfo{set: "gpt2", keepSpaces: true}, "trillion", "granite-docling")
	add(preInfo{set: "jais2"}, "jais-2")
	add(preInfo{set: "starcoder"}, "starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2")
	add(preInfo{set: "starcoder", keepSpaces: true}, "command-r", "smollm")
	add(preInfo{set: "qwen2", keepSpaces: true}, "qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "hunyuan", "grok-2", "solar-open")
	add(preInfo{set: "qwen2"}, "megrez", "stablelm2")
	add(preInfo{set: "qwen35", keepSpaces: true}, "qwen35")
	add(preInfo{set: "llama3"}, "dbrx", "smaug-bpe")
	add(preInfo{set: "llama3", noBOS: true}, "glm4", "chatglm-bpe")
	add(preInfo{set: "poro", keepSpaces: true}, "poro-chat")
	add(preInfo{set: "poro"}, "bloom", "gpt3-finnish")
	add(preInfo{set: "viking", keepSpaces: true}, "viking")
	add(preInfo{set: "tekken", keepSpaces: true, ignoreMerges: true, addBOS: true}, "tekken")
	add(preInfo{set: "chameleon", keepSpaces: true, addBOS: true}, "chameleon")
	add(preInfo{set: "gpt4o", keepSpaces: true}, "gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2")
	add(preInfo{set: "granite-emb-multi", keepSpaces: true, ignoreMerges: true}, "granite-embed-multi-97m")
	add(preInfo{set: "tiny-aya", keepSpaces: true}, "tiny_aya", "cohere2moe")
	add(preInfo{set: "bailingmoe", keepSpaces: true}, "bailingmoe", "bailingmoe2", "llada-moe")
	add(preInfo{set: "seed-coder", keepSpaces: true}, "seed-coder")
	add(preInfo{set: "ufakzeka", keepSpaces: true}, "ufakzeka")
	add(preInfo{set: "laguna", keepSpaces: true}, "laguna")
	add(preInfo{set: "exaone-moe"}, "exaone-moe")
	return m
}()

// unsupportedPre are pre-tokenizers llama.cpp knows that need machinery this
// package does not have (raw-UTF-8 BPE, Kimi's Han splitter, zero-width
// splits); they are refused rather than silently tokenized differently.
var unsupportedPre = map[string]bool{
	"kimi-k2": true, "afmoe": true, "superbpe": true, "gemma4": true,
	"granite-embed-multi-311m": true, "sarvam-moe": true, "whitespace": true,
}

// splitFunc is a hand-written equivalent of one regex, as llama.cpp has for
// the most common ones: it splits each piece (lengths in codepoints) of cpts.
type splitFunc func(cpts []rune, pieces []int) []int

var customSplits = map[string]splitFunc{
	reGPT2:     splitGPT2,
	reLlama3:   func(c []rune, p []int) []int { return splitLlama3Like(c, p, 3, false) },
	reLlama3CI: func(c []rune, p []int) []int { return splitLlama3Like(c, p, 3, false) },
	reQwen2:    func(c []rune, p []int) []int { return splitLlama3Like(c, p, 1, false) },
	reQwen35:   func(c []rune, p []int) []int { return splitLlama3Like(c, p, 1, true) },
	reNewlines: splitNewlines,
	reAyaDigit: splitDigitGroups,
}

// regexStep is one regex of a set, compiled for the path llama.cpp takes.
type regexStep struct {
	custom    splitFunc
	re        *regexp2.Regexp
	collapsed bool // run on the category-collapsed text
}

type preTokenizer struct {
	steps        []regexStep
	needCollapse bool
}

var (
	preCacheMu sync.Mutex
	preCache   = map[string]*preTokenizer{}
)

// compilePre builds (once per set) the steps for a regex set.
func compilePre(set string) (*preTokenizer, error) {
	preCacheMu.Lock()
	defer preCacheMu.Unlock()
	if p, ok := preCache[set]; ok {
		return p, nil
	}
	p := &preTokenizer{}
	for _, expr := range regexSets[set] {
		if f, ok := customSplits[expr]; ok {
			p.steps = append(p.steps, regexStep{custom: f})
			continue
		}
		pattern, collapsed, err := translateRegex(expr)
		if err != nil {
			return nil, fmt.Errorf("pre-tokenizer %s: %w", set, err)
		}
		re, err := regexp2.Compile(pattern, regexp2.ECMAScript)
		if err != nil {
			return nil, fmt.Errorf("pre-tokenizer %s: compiling %q: %w", set, pattern, err)
		}
		p.steps = append(p.steps, regexStep{re: re, collapsed: collapsed})
		p.needCollapse = p.needCollapse || collapsed
	}
	preCache[set] = p
	return p, nil
}

// Placeholders for the category-collapsed text. llama.cpp replaces every
// non-ASCII codepoint by one byte naming its category (0xD0..0xD5) and runs
// std::regex over that; we use private-use runes, which nothing else in the
// collapsed text can be.
const (
	phOther  = 0xE0D0
	phNumber = 0xE0D1
	phLetter = 0xE0D2
	phPunct  = 0xE0D3
	phMark   = 0xE0D4
	phSymbol = 0xE0D5
)

// ucat lists the \p{..} classes llama.cpp collapses, with the placeholder
// and the ASCII members each stands for.
var ucat = map[string]struct {
	ph    rune
	ascii string
}{
	`\p{N}`:  {phNumber, `0-9`},
	`\p{L}`:  {phLetter, `A-Za-z`},
	`\p{P}`:  {phPunct, `!-#%-*,-/:-;?-@\[-\]_\{\}`},
	`\p{M}`:  {phMark, ``},
	`\p{S}`:  {phSymbol, `\$\+<->^` + "`" + `\|\~`},
	`\p{Lu}`: {phLetter, `A-Za-z`},
	`\p{Ll}`: {phLetter, `A-Za-z`},
	`\p{Lt}`: {phLetter, `A-Za-z`},
	`\p{Lm}`: {phLetter, `A-Za-z`},
	`\p{Lo}`: {phLetter, `A-Za-z`},
}

func collapseRune(r rune) rune {
	if r < 128 {
		return r
	}
	f := flagsOf(r)
	switch {
	case f.is(flagWhitespace):
		// std::regex's \s knows only ASCII whitespace: llama.cpp stands in
		// a vertical tab for the others.
		return 0x0B
	case f&flagCategories == flagNumber:
		return phNumber
	case f&flagCategories == flagLetter:
		return phLetter
	case f&flagCategories == flagPunct:
		return phPunct
	case f&flagCategories == flagMark:
		return phMark
	case f&flagCategories == flagSymbol:
		return phSymbol
	}
	return phOther
}

// translateRegex turns a llama.cpp regex into the regexp2 pattern that
// matches the same text llama.cpp's std::regex does. Regexes naming Unicode
// categories are rewritten for the collapsed text exactly as llama.cpp
// rewrites them (including its way of telling whether a \p{..} sits inside
// brackets); the others run on the codepoints with non-ASCII whitespace
// turned into a vertical tab. Either way \s must mean ASCII whitespace only,
// as in std::regex, while regexp2's ECMAScript \s knows Unicode spaces.
func translateRegex(expr string) (pattern string, collapsed bool, err error) {
	for k := range ucat {
		if strings.Contains(expr, k) {
			collapsed = true
			break
		}
	}
	if collapsed {
		for _, r := range expr {
			if r >= 128 {
				return "", false, fmt.Errorf("regex %q mixes Unicode categories and non-ASCII characters (llama.cpp refuses it too)", expr)
			}
		}
		var b strings.Builder
		inside := false
		for i := 0; i < len(expr); i++ {
			c := expr[i]
			if c == '[' && (i == 0 || expr[i-1] != '\\') {
				b.WriteByte('[')
				inside = true
				continue
			}
			if inside && c == ']' && expr[i-1] != '\\' {
				b.WriteByte(']')
				inside = false
				continue
			}
			if c == '\\' && i+3 < len(expr) && expr[i+1] == 'p' && expr[i+2] == '{' {
				if j := strings.IndexByte(expr[i+3:], '}'); j >= 0 && i+3+j <= i+10 {
					closing := i + 3 + j
					if cat, ok := ucat[expr[i:closing+1]]; ok {
						if !inside {
							b.WriteByte('[')
						}
						b.WriteRune(cat.ph)
						b.WriteString(cat.ascii)
						if !inside {
							b.WriteByte(']')
						}
						i = closing
						continue
					}
				}
			}
			b.WriteByte(c)
		}
		expr = b.String()
	}
	pattern, err = asciiSpaces(expr)
	return pattern, collapsed, err
}

// asciiSpaces rewrites \s and \S to the ASCII whitespace class.
func asciiSpaces(expr string) (string, error) {
	var b strings.Builder
	inside := false
	for i := 0; i < len(expr); i++ {
		c := expr[i]
		switch {
		case c == '\\' && i+1 < len(expr):
			n := expr[i+1]
			switch {
			case n == 's' && inside:
				b.WriteString(`\t-\r `)
			case n == 's':
				b.WriteString(`[\t-\r ]`)
			case n == 'S' && !inside:
				b.WriteString(`[^\t-\r ]`)
			case n == 'S':
				return "", fmt.Errorf(`regex %q: \S inside brackets is not supported`, expr)
			default:
				b.WriteByte(c)
				b.WriteByte(n)
			}
			i++
		case c == '[' && !inside:
			inside = true
			b.WriteByte(c)
		case c == ']' && inside:
			inside = false
			b.WriteByte(c)
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), nil
}

// split cuts text into pre-tokens as llama.cpp's unicode_regex_split does
// and returns them byte-level encoded, ready for BPE.
func (p *preTokenizer) split(text string) ([]string, error) {
	cpts := decodeCodepoints(text)
	pieces := []int{len(cpts)}

	var collapsedText, wideText []rune
	for _, st := range p.steps {
		if st.custom != nil {
			pieces = st.custom(cpts, pieces)
			continue
		}
		var in []rune
		if st.collapsed {
			if collapsedText == nil {
				collapsedText = make([]rune, len(cpts))
				for i, r := range cpts {
					collapsedText[i] = collapseRune(r)
				}
			}
			in = collapsedText
		} else {
			if wideText == nil {
				wideText = make([]rune, len(cpts))
				for i, r := range cpts {
					if r > 0x7F && flagsOf(r).is(flagWhitespace) {
						r = 0x0B
					}
					wideText[i] = r
				}
			}
			in = wideText
		}
		var err error
		if pieces, err = regexSplit(st.re, in, pieces); err != nil {
			return nil, err
		}
	}

	words := make([]string, 0, len(pieces))
	var raw, enc []byte
	start := 0
	for _, n := range pieces {
		raw = raw[:0]
		for _, r := range cpts[start : start+n] {
			var err error
			if raw, err = appendCodepoint(raw, r); err != nil {
				return nil, err
			}
		}
		start += n
		enc = byteEncode(enc[:0], raw)
		words = append(words, string(enc))
	}
	return words, nil
}

// regexSplit splits every piece into matches and the text between them,
// like llama.cpp's unicode_regex_split_stl.
func regexSplit(re *regexp2.Regexp, text []rune, pieces []int) ([]int, error) {
	out := make([]int, 0, len(pieces))
	start := 0
	for _, n := range pieces {
		seg := text[start : start+n]
		start += n
		prev := 0
		m, err := re.FindRunesMatch(seg)
		for ; m != nil && err == nil; m, err = re.FindNextMatch(m) {
			if m.Index > prev {
				out = append(out, m.Index-prev)
			}
			if m.Length > 0 {
				out = append(out, m.Length)
			}
			prev = m.Index + m.Length
		}
		if err != nil {
			return nil, err
		}
		if prev < n {
			out = append(out, n-prev)
		}
	}
	return out, nil
}

// outOfRange is what the hand-written splitters see past a piece's end.
const outOfRange rune = -1

// pieceCursor gives the hand-written splitters llama.cpp's view of one
// piece: codepoints and flags inside it, nothing outside.
type pieceCursor struct {
	cpts     []rune
	ini, end int
	prev     int
	out      []int
}

func (c *pieceCursor) cpt(p int) rune {
	if p >= c.ini && p < c.end {
		return c.cpts[p]
	}
	return outOfRange
}

func (c *pieceCursor) flags(p int) cpFlags {
	if p >= c.ini && p < c.end {
		return flagsOf(c.cpts[p])
	}
	return 0
}

// emit ends a pre-token at end and returns its length.
func (c *pieceCursor) emit(end int) int {
	n := end - c.prev
	if n > 0 {
		c.out = append(c.out, n)
	}
	c.prev = end
	return n
}

func forEachPiece(cpts []rune, pieces []int, f func(c *pieceCursor)) []int {
	c := &pieceCursor{cpts: cpts, out: make([]int, 0, len(pieces))}
	start := 0
	for _, n := range pieces {
		c.ini, c.end, c.prev = start, start+n, start
		start += n
		f(c)
	}
	return c.out
}

func asciiLower(r rune) rune {
	if r >= 'A' && r <= 'Z' {
		return r + 'a' - 'A'
	}
	return r
}

// contraction matches 's 't 'm 'd 're 've 'll at pos and returns its length.
func (c *pieceCursor) contraction(pos int, fold bool) int {
	if c.cpt(pos) != '\'' || pos+1 >= c.end {
		return 0
	}
	low := func(r rune) rune {
		if fold {
			return asciiLower(r)
		}
		return r
	}
	n1 := low(c.cpt(pos + 1))
	if n1 == 's' || n1 == 't' || n1 == 'm' || n1 == 'd' {
		return 2
	}
	if pos+2 < c.end {
		n2 := low(c.cpt(pos + 2))
		if (n1 == 'r' && n2 == 'e') || (n1 == 'v' && n2 == 'e') || (n1 == 'l' && n2 == 'l') {
			return 3
		}
	}
	return 0
}

// splitGPT2 implements 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+|
// ?[^\s\p{L}\p{N}]+|\s+(?!\S) the way llama.cpp's hand-written splitter does
// (which, unlike the regex, also splits off a lone trailing whitespace run).
func splitGPT2(cpts []rune, pieces []int) []int {
	const wln = flagWhitespace | flagLetter | flagNumber
	return forEachPiece(cpts, pieces, func(c *pieceCursor) {
		for pos := c.ini; pos < c.end; {
			if n := c.contraction(pos, false); n > 0 {
				pos += c.emit(pos + n)
				continue
			}
			cp := c.cpt(pos)
			f2 := c.flags(pos)
			if cp == ' ' {
				f2 = c.flags(pos + 1)
			}
			switch {
			case f2.is(flagLetter), f2.is(flagNumber):
				class := f2 & (flagLetter | flagNumber)
				if cp == ' ' {
					pos++
				}
				for f2.is(class) {
					pos++
					f2 = c.flags(pos)
				}
				c.emit(pos)
				continue
			case !f2.is(wln) && f2 != 0:
				if cp == ' ' {
					pos++
				}
				for !f2.is(wln) && f2 != 0 {
					pos++
					f2 = c.flags(pos)
				}
				c.emit(pos)
				continue
			}
			ws := 0
			for c.flags(pos + ws).is(flagWhitespace) {
				ws++
			}
			switch {
			case ws > 1 && c.cpt(pos+ws) != outOfRange: // \s+(?!\S)
				pos += ws - 1
			case ws > 0:
				pos += ws
			default:
				pos++
			}
			c.emit(pos)
		}
	})
}

// splitLlama3Like implements llama.cpp's hand-written splitters for the
// llama3 regex (digits in groups of up to 3), the qwen2 one (single digits)
// and qwen35 (letters also absorb combining marks).
func splitLlama3Like(cpts []rune, pieces []int, digits int, marks bool) []int {
	letter := flagLetter
	if marks {
		letter |= flagMark
	}
	stop := flagWhitespace | letter | flagNumber
	return forEachPiece(cpts, pieces, func(c *pieceCursor) {
		for pos := c.ini; pos < c.end; {
			if n := c.contraction(pos, true); n > 0 {
				pos += c.emit(pos + n)
				continue
			}
			cp := c.cpt(pos)
			f := c.flags(pos)

			// [^\r\n\p{L}\p{N}]?\p{L}+
			if !(cp == '\r' || cp == '\n' || f.is(flagNumber)) {
				if f.is(letter) || c.flags(pos+1).is(letter) {
					pos++
					for c.flags(pos).is(letter) {
						pos++
					}
					c.emit(pos)
					continue
				}
			}

			// \p{N}{1,digits}
			if f.is(flagNumber) {
				pos = c.digitGroups(pos, digits)
				continue
			}

			// ' ?[^\s\p{L}\p{N}]+[\r\n]*'; llama.cpp tests the current
			// codepoint's flags for "in range" here, not the next one's.
			f2 := f
			if cp == ' ' {
				f2 = c.flags(pos + 1)
			}
			if !f2.is(stop) && f != 0 {
				if cp == ' ' {
					pos++
				}
				for !f2.is(stop) && f2 != 0 {
					pos++
					f2 = c.flags(pos)
				}
				for r := c.cpt(pos); r == '\r' || r == '\n'; r = c.cpt(pos) {
					pos++
				}
				c.emit(pos)
				continue
			}

			// \s*[\r\n]+|\s+(?!\S)|\s+
			pos = c.llama3Spaces(pos)
			c.emit(pos)
		}
	})
}

// digitGroups matches \p{N}{1,digits} as often as it can from pos, the way llama.cpp's
// splitter does: it walks the whole run of digits and cuts it every digits codepoints, rather
// than matching one group per turn of the caller's loop. It returns the run's end.
func (c *pieceCursor) digitGroups(pos, digits int) int {
	if digits == 1 {
		pos++
		c.emit(pos)
		return pos
	}
	ini := pos
	for c.flags(pos).is(flagNumber) {
		pos++
		if pos-ini >= digits {
			c.emit(pos)
			ini = pos
		}
	}
	c.emit(pos)
	return pos
}

// llama3Spaces is where the last alternatives of the llama3 regex end a pre-token that starts
// at pos: \s*[\r\n]+, then \s+(?!\S) (which leaves the space before a word to the word),
// then \s+. A codepoint none of the regex matches makes a pre-token of its own.
func (c *pieceCursor) llama3Spaces(pos int) int {
	ws, lastRN := 0, 0
	for c.flags(pos + ws).is(flagWhitespace) {
		if r := c.cpt(pos + ws); r == '\r' || r == '\n' {
			lastRN = pos + ws + 1
		}
		ws++
	}
	switch {
	case lastRN > 0: // \s*[\r\n]+
		return lastRN
	case ws > 1 && c.cpt(pos+ws) != outOfRange: // \s+(?!\S)
		return pos + ws - 1
	case ws > 0: // \s+
		return pos + ws
	default:
		return pos + 1
	}
}

// splitNewlines implements [^\n]+|[\n]+.
func splitNewlines(cpts []rune, pieces []int) []int {
	return forEachPiece(cpts, pieces, func(c *pieceCursor) {
		for pos := c.ini; pos < c.end; {
			nl := c.cpts[pos] == '\n'
			for pos < c.end && (c.cpts[pos] == '\n') == nl {
				pos++
			}
			c.emit(pos)
		}
	})
}

// splitDigitGroups is llama.cpp's AFMoE digit splitter, which it also uses
// for \d{1,3}(?=(?:\d{3})*\b): digit runs are cut in threes from the right.
// As in llama.cpp, text before a digit run joins its first group.
func splitDigitGroups(cpts []rune, pieces []int) []int {
	return forEachPiece(cpts, pieces, func(c *pieceCursor) {
		for pos := c.ini; pos < c.end; {
			if !c.flags(pos).is(flagNumber) {
				pos++
				continue
			}
			first := pos
			for pos < c.end && c.flags(pos).is(flagNumber) {
				pos++
			}
			count := pos - first
			cur := first
			if rem := count % 3; rem > 0 {
				c.emit(cur + rem)
				cur += rem
			}
			for cur < first+count {
				c.emit(cur + 3)
				cur += 3
			}
		}
		if c.prev < c.end {
			c.emit(c.end)
		}
	})
}

// PreTokenize splits text the way a byte-level BPE vocabulary with
// tokenizer.ggml.pre = pre splits it before merging, and returns the pieces
// byte-level encoded (a space as "Ġ", a newline as "Ċ"). Tools that train a
// BPE vocabulary use it so that their merges are learnt on exactly the pieces
// this package and llama.cpp will later merge.
func PreTokenize(pre, text string) ([]string, error) {
	info, ok := preTypes[pre]
	if !ok {
		return nil, fmt.Errorf("tokenizer: unknown pre-tokenizer %q", pre)
	}
	p, err := compilePre(info.set)
	if err != nil {
		return nil, err
	}
	return p.split(text)
}
