package tokenizer

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/chat/*.txt from the current rendering")

type chatCases struct {
	Messages []Message `json:"messages"`
	Cases    []struct {
		Name  string `json:"name"`
		GGUF  string `json:"gguf"`
		Arch  string `json:"arch"`
		EOSID *int   `json:"eos_id"`
		BOS   string `json:"bos"`
		EOS   string `json:"eos"`
	} `json:"cases"`
}

func readChatCases(t *testing.T) chatCases {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "chat", "cases.json"))
	if err != nil {
		t.Fatal(err)
	}
	var c chatCases
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	return c
}

// chatTokenizer loads a fixture vocabulary with another chat template (""
// removes it) and optionally another architecture and EOS.
func chatTokenizer(t *testing.T, gguf, template, arch string, eosID *int) *Tokenizer {
	t.Helper()
	kv := loadKV(t, gguf)
	if template == "" {
		delete(kv, keyChatTemplate)
	} else {
		kv[keyChatTemplate] = template
	}
	if arch != "" {
		kv[keyArch] = arch
	}
	if eosID != nil {
		kv["tokenizer.ggml.eos_token_id"] = uint32(*eosID)
	}
	tok, err := FromGGUF(kv)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// checkChatGolden compares a rendering with testdata/chat/name (-update rewrites it).
func checkChatGolden(t *testing.T, name, got string) {
	t.Helper()
	golden := filepath.Join("testdata", "chat", name)
	if *update {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("%s: rendered\n%q\nwant\n%q", name, got, want)
	}
}

// TestChatTemplates renders the real chat templates of our models for a
// two-turn conversation and compares with testdata/chat/<name>.txt
// (go test -run TestChatTemplates -update rewrites them;
// tools/tokgolden/chat_check.py checks them against Python's jinja2).
func TestChatTemplates(t *testing.T) {
	cc := readChatCases(t)
	for _, c := range cc.Cases {
		t.Run(c.Name, func(t *testing.T) {
			src, err := os.ReadFile(filepath.Join("testdata", "chat", c.Name+".jinja"))
			if err != nil {
				t.Fatal(err)
			}
			tok := chatTokenizer(t, c.GGUF, string(src), c.Arch, c.EOSID)
			if bos, _ := tok.BOS(); tok.tokenText(bos) != c.BOS || tok.tokenText(tok.EOS()) != c.EOS {
				t.Fatalf("fixture has bos %q eos %q, cases.json says %q %q", tok.tokenText(bos), tok.tokenText(tok.EOS()), c.BOS, c.EOS)
			}
			p, err := tok.RenderChatPrompt(cc.Messages, true)
			if err != nil {
				t.Fatal(err)
			}
			if p.Source != SourceGGUF {
				t.Fatalf("rendered with %s %s: template error %v", p.Source, p.Format, p.TemplateErr)
			}
			checkChatGolden(t, c.Name+".txt", p.Text)
		})
	}
}

// TestChatBuiltin: with no template, each architecture gets its built-in
// format, which matches what the model's own template renders for a plain
// conversation.
func TestChatBuiltin(t *testing.T) {
	cc := readChatCases(t)
	plain := []Message{
		{Role: "user", Content: "Hello! Wie geht's?"},
		{Role: "assistant", Content: "Fine, thanks."},
		{Role: "user", Content: "What is 2+2?"},
	}
	for _, tc := range []struct {
		name, template, format string
	}{
		{"mixtral", "mixtral", "mistral"},
		{"deepseek2", "deepseek2", "deepseek2"},
		{"qwen3", "qwen3", "chatml"},
		{"olmoe", "olmoe", "olmoe"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c = cc.Cases[0]
			for _, x := range cc.Cases {
				if x.Name == tc.name {
					c = x
				}
			}
			src, err := os.ReadFile(filepath.Join("testdata", "chat", tc.template+".jinja"))
			if err != nil {
				t.Fatal(err)
			}
			withTemplate := chatTokenizer(t, c.GGUF, string(src), c.Arch, c.EOSID)
			without := chatTokenizer(t, c.GGUF, "", c.Arch, c.EOSID)
			want, err := withTemplate.RenderChat(plain, true)
			if err != nil {
				t.Fatal(err)
			}
			p, err := without.RenderChatPrompt(plain, true)
			if err != nil {
				t.Fatal(err)
			}
			if p.Source != SourceBuiltin || p.Format != tc.format || p.TemplateErr != nil {
				t.Errorf("source %q format %q err %v, want builtin %q", p.Source, p.Format, p.TemplateErr, tc.format)
			}
			if tc.name == "olmoe" {
				// The built-in OLMoE format leaves out the template's BOS.
				want = strings.TrimPrefix(want, c.BOS)
			}
			if p.Text != want {
				t.Errorf("built-in\n%q\ntemplate\n%q", p.Text, want)
			}
		})
	}
}

// TestChatFallback: a template that raises (Mixtral's, on roles that do not
// alternate) or does not parse falls back to the built-in format and says
// why; an architecture without one is an error.
func TestChatFallback(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("testdata", "chat", "mixtral.jinja"))
	if err != nil {
		t.Fatal(err)
	}
	tok := chatTokenizer(t, "mistral.gguf.gz", string(src), "", nil)
	p, err := tok.RenderChatPrompt([]Message{{Role: "user", Content: "a"}, {Role: "user", Content: "b"}}, true)
	if err != nil {
		t.Fatal(err)
	}
	if p.Source != SourceBuiltin || p.TemplateErr == nil || !strings.Contains(p.TemplateErr.Error(), "raise_exception") || !strings.Contains(p.TemplateErr.Error(), "must alternate") {
		t.Errorf("got source %q err %v; want builtin after raise_exception", p.Source, p.TemplateErr)
	}
	if want := "<s> [INST] a [/INST] [INST] b [/INST]"; p.Text != want {
		t.Errorf("fallback %q, want %q", p.Text, want)
	}

	broken := chatTokenizer(t, "qwen3.gguf.gz", "{% for m in messages %}{{ m.content ", "", nil)
	p, err = broken.RenderChatPrompt([]Message{{Role: "user", Content: "hi"}}, true)
	if err != nil || p.Source != SourceBuiltin || p.TemplateErr == nil {
		t.Errorf("broken template: %+v, %v", p, err)
	}

	// Templates come with downloaded models: no reading local files.
	include := chatTokenizer(t, "qwen3.gguf.gz", `{% include "/etc/hostname" %}{{ messages[0].content }}`, "", nil)
	p, err = include.RenderChatPrompt([]Message{{Role: "user", Content: "hi"}}, true)
	if err != nil || p.Source != SourceBuiltin || p.TemplateErr == nil {
		t.Errorf("include: %+v, %v", p, err)
	}

	unknown := chatTokenizer(t, "qwen3.gguf.gz", "", "no-such-arch", nil)
	if _, err := unknown.RenderChat([]Message{{Role: "user", Content: "hi"}}, true); err == nil || !strings.Contains(err.Error(), "no-such-arch") {
		t.Errorf("unknown architecture without template: err %v", err)
	}
}

// TestEncodePrompt: the template's own BOS is not doubled, and one is added
// when the vocabulary wants it and the template did not write it.
func TestEncodePrompt(t *testing.T) {
	tok := loadTokenizer(t, "mistral.gguf.gz", "")
	ids, err := tok.EncodePrompt("<s> [INST] hi [/INST]")
	if err != nil {
		t.Fatal(err)
	}
	if ids[0] != 1 || ids[1] == 1 {
		t.Errorf("EncodePrompt with template BOS = %v", ids)
	}
	ids, err = tok.EncodePrompt("[INST] hi [/INST]")
	if err != nil {
		t.Fatal(err)
	}
	if ids[0] != 1 || ids[1] == 1 {
		t.Errorf("EncodePrompt without BOS = %v", ids)
	}
	q := loadTokenizer(t, "qwen3.gguf.gz", "")
	ids, err = q.EncodePrompt("<|im_start|>user\nhi<|im_end|>\n")
	if err != nil {
		t.Fatal(err)
	}
	if want := []int32{151644, 872, 198, 6023, 151645, 198}; !equalIDs(ids, want) {
		t.Errorf("qwen EncodePrompt = %v, want %v", ids, want)
	}
}

func equalIDs(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
