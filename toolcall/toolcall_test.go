package toolcall

import (
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

type want struct {
	content string
	calls   []Call // IDs ignored
}

var weather = Tool{Name: "get_weather", Description: "Weather now.",
	Parameters: json.RawMessage(`{"type": "object", "properties": {"city": {"type": "string", "minLength": 1}, "days": {"type": "integer", "minimum": 1}}, "required": ["city"]}`)}
var add = Tool{Name: "add", Parameters: json.RawMessage(`{"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}`)}

var parseCases = []struct {
	format, name, text string
	want               want
}{
	{"hermes", "one call", "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
		want{"", []Call{{Name: "get_weather", Arguments: `{"city": "Paris"}`}}}},
	{"hermes", "text then two calls", "Let me check.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Bern\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>",
		want{"Let me check.", []Call{{Name: "get_weather", Arguments: `{"city": "Bern"}`}, {Name: "add", Arguments: `{"a": 1, "b": 2}`}}}},
	{"hermes", "arguments as a string", "<tool_call>\n{\"name\": \"add\", \"arguments\": \"{\\\"a\\\": 1}\"}\n</tool_call>",
		want{"", []Call{{Name: "add", Arguments: `{"a": 1}`}}}},
	{"hermes", "arguments first", "<tool_call>{\"arguments\": {}, \"name\": \"add\"}</tool_call>",
		want{"", []Call{{Name: "add", Arguments: `{}`}}}},
	{"hermes", "no close", "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1}}",
		want{"", []Call{{Name: "add", Arguments: `{"a": 1}`}}}},
	{"hermes", "not a call", "Use <tool_call> tags, like <tool_call>this</tool_call>.",
		want{"Use <tool_call> tags, like <tool_call>this</tool_call>.", nil}},
	{"hermes", "plain text", "Hello <tool world.", want{"Hello <tool world.", nil}},
	{"hermes", "marker-like text at the end", "a <tool_ca", want{"a <tool_ca", nil}},
	{"mistral", "array", "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"add\", \"arguments\": {\"a\": 2}}]",
		want{"", []Call{{Name: "get_weather", Arguments: `{"city": "Paris"}`}, {Name: "add", Arguments: `{"a": 2}`}}}},
	{"mistral", "v11", "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]add[ARGS]{\"a\": 1}",
		want{"", []Call{{Name: "get_weather", Arguments: `{"city": "Paris"}`}, {Name: "add", Arguments: `{"a": 1}`}}}},
	{"deepseek", "v3", "Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n```json\n{\"a\": 1}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
		want{"Sure.", []Call{{Name: "get_weather", Arguments: `{"city": "Paris"}`}, {Name: "add", Arguments: `{"a": 1}`}}}},
	{"deepseek", "v3.1", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>add<｜tool▁sep｜>{\"a\": 1}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
		want{"", []Call{{Name: "add", Arguments: `{"a": 1}`}}}},
	{"glm4.5", "two arguments", "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris, \"FR\"</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>",
		want{"", []Call{{Name: "get_weather", Arguments: `{"city": "Paris, \"FR\"", "days": 3}`}}}},
	{"glm4.5", "no arguments", "Now.<tool_call>add</tool_call>", want{"Now.", []Call{{Name: "add", Arguments: `{}`}}}},
	{"llama3", "one call", `{"name": "add", "parameters": {"a": 1}}`, want{"", []Call{{Name: "add", Arguments: `{"a": 1}`}}}},
	{"llama3", "python tag", `<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}`,
		want{"", []Call{{Name: "get_weather", Arguments: `{"city": "Oslo"}`}}}},
	{"llama3", "text", `I know {"name"s} but no call.`, want{`I know {"name"s} but no call.`, nil}},
	{"harmony", "analysis then final", "<|channel|>analysis<|message|>The user greets.<|end|><|start|>assistant<|channel|>final<|message|>Hello <there>!<|return|>",
		want{"Hello <there>!", nil}},
	{"harmony", "a call", "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>",
		want{"", []Call{{Name: "get_weather", Arguments: `{"city": "Paris"}`}}}},
	{"harmony", "recipient before the channel", "<|start|>assistant to=functions.add<|channel|>commentary json<|message|>{\"a\": 1}<|call|>",
		want{"", []Call{{Name: "add", Arguments: `{"a": 1}`}}}},
	{"harmony", "cut short", "<|channel|>final<|message|>Hel", want{"Hel", nil}},
	{"generic", "calls", `{"tool_calls": [{"name": "add", "arguments": {"a": 1}}, {"name": "get_weather", "arguments": {"city": "Rome"}}]}`,
		want{"", []Call{{Name: "add", Arguments: `{"a": 1}`}, {Name: "get_weather", Arguments: `{"city": "Rome"}`}}}},
	{"generic", "response", `{"response": "It is \"sunny\" \u00e9\n\ud83d\ude00 ok"}`, want{"It is \"sunny\" é\n😀 ok", nil}},
	{"generic", "other JSON", `{"answer": 1}`, want{`{"answer": 1}`, nil}},
}

// TestParse: every format's answers parse to the same text and calls whether read whole,
// a byte at a time or in random pieces, and the streamed argument pieces add up to the
// calls' arguments.
func TestParse(t *testing.T) {
	for _, c := range parseCases {
		f, err := ByName(c.format)
		if err != nil {
			t.Fatal(err)
		}
		for split := range 4 {
			p := NewParser(f)
			var content strings.Builder
			args := map[int]string{}
			names := map[int]string{}
			apply := func(d Delta) {
				content.WriteString(d.Content)
				for _, cd := range d.Calls {
					if cd.Name != "" {
						if names[cd.Index] != "" || cd.ID == "" {
							t.Fatalf("%s/%s: call %d named twice or without an id", c.format, c.name, cd.Index)
						}
						names[cd.Index] = cd.Name
					} else if names[cd.Index] == "" {
						t.Fatalf("%s/%s: arguments of call %d before its name", c.format, c.name, cd.Index)
					}
					args[cd.Index] += cd.Args
				}
			}
			rng := rand.New(rand.NewPCG(uint64(split), 1))
			for text := c.text; text != ""; {
				n := len(text)
				switch split {
				case 1:
					n = 1
				case 2, 3:
					n = min(n, 1+rng.IntN(8))
				}
				apply(p.Add(text[:n]))
				text = text[n:]
			}
			apply(p.Finish())
			if content.String() != c.want.content || p.Content() != c.want.content {
				t.Errorf("%s/%s split %d: content %q (streamed %q), want %q", c.format, c.name, split, p.Content(), content.String(), c.want.content)
			}
			calls := p.Calls()
			if len(calls) != len(c.want.calls) {
				t.Fatalf("%s/%s split %d: calls %+v, want %+v", c.format, c.name, split, calls, c.want.calls)
			}
			for i, call := range calls {
				w := c.want.calls[i]
				if call.Name != w.Name || call.Arguments != w.Arguments || names[i] != w.Name || args[i] != w.Arguments {
					t.Errorf("%s/%s split %d: call %d %+v (streamed %s %s), want %+v", c.format, c.name, split, i, call, names[i], args[i], w)
				}
			}
		}
	}
}

// TestGrammars: what each format's grammar makes a model write is what its parser reads,
// and the grammar refuses calls to unknown tools or with arguments of the wrong shape.
func TestGrammars(t *testing.T) {
	tools := []Tool{weather, add}
	for _, c := range parseCases {
		switch c.format + "/" + c.name {
		case "hermes/one call", "hermes/text then two calls", "mistral/array", "deepseek/v3", "generic/calls", "llama3/one call":
		case "harmony/a call":
			c.text = strings.TrimSuffix(c.text[strings.Index(c.text, "<|start|>assistant")+len("<|start|>assistant"):], "<|call|>")
		default:
			continue
		}
		f, _ := ByName(c.format)
		g, err := f.Grammar(tools, true)
		if err != nil {
			t.Fatal(err)
		}
		text := c.text
		if c.want.content != "" {
			text = text[strings.Index(text, f.starts()[0]):]
		}
		if !g.Match([]byte(text)) {
			t.Errorf("%s/%s: the grammar refuses %q", c.format, c.name, text)
		}
		one, _ := f.Grammar(tools, false)
		if c.format == "harmony" {
			continue
		}
		if len(c.want.calls) > 1 && one.Match([]byte(text)) {
			t.Errorf("%s/%s: the one-call grammar takes %d calls", c.format, c.name, len(c.want.calls))
		}
		bad := strings.Replace(text, "get_weather", "get_whether", 1)
		if bad != text && g.Match([]byte(bad)) {
			t.Errorf("%s/%s: the grammar takes an unknown tool", c.format, c.name)
		}
	}
	g, err := AnswerGrammar(tools, false)
	if err != nil {
		t.Fatal(err)
	}
	for text, ok := range map[string]bool{`{"response": "hi"}`: true, `{"tool_calls": [{"name": "add", "arguments": {"a": 1}}]}`: true,
		`{"tool_calls": [{"name": "get_weather", "arguments": {"days": 2}}]}`: false, `{"other": 1}`: false} {
		if g.Match([]byte(text)) != ok {
			t.Errorf("generic answer grammar: Match(%s) = %v", text, !ok)
		}
	}
	if _, err := ByName("glm4.5"); err != nil {
		t.Fatal(err)
	}

}

func TestDetect(t *testing.T) {
	for tmpl, want := range map[string]string{
		"{{ '<tool_call>\\n' }}":       "hermes",
		"[TOOL_CALLS] {{ x }}":         "mistral",
		"<｜tool▁calls▁begin｜>":         "deepseek",
		"<tool_call>{{ n }}<arg_key>":  "glm4.5",
		"{{ messages[0]['content'] }}": "generic",
		"":                             "generic",
	} {
		if got := Detect(tmpl).Name(); got != want {
			t.Errorf("Detect(%q) = %s, want %s", tmpl, got, want)
		}
	}
}

func TestValidate(t *testing.T) {
	for _, c := range []struct {
		tools []Tool
		ok    bool
	}{
		{[]Tool{weather, add}, true},
		{[]Tool{{Name: "a b"}}, false},
		{[]Tool{{Name: ""}}, false},
		{[]Tool{add, add}, false},
		{[]Tool{{Name: "x", Parameters: json.RawMessage(`[1]`)}}, false},
		{[]Tool{{Name: "x", Parameters: json.RawMessage(`{`)}}, false},
	} {
		if err := Validate(c.tools); (err == nil) != c.ok {
			t.Errorf("Validate(%+v) = %v", c.tools, err)
		}
	}
	if _, err := Select([]Tool{add}, Choice{Mode: Named, Name: "nope"}); err == nil {
		t.Error("Select of an unknown name")
	}
	if ts, _ := Select([]Tool{weather, add}, Choice{Mode: Named, Name: "add"}); len(ts) != 1 || ts[0].Name != "add" {
		t.Errorf("Select named: %+v", ts)
	}
	if id := (mistral{}).NewID(); len(id) != 9 {
		t.Errorf("mistral id %q", id)
	}
}

// FuzzParser: any text, in any pieces, parses without panic to the same answer as whole.
func FuzzParser(f *testing.F) {
	for _, c := range parseCases {
		f.Add(c.text, uint8(0), uint8(3))
	}
	f.Fuzz(func(t *testing.T, text string, which, step uint8) {
		fm := formats[int(which)%len(formats)]
		whole := NewParser(fm)
		whole.Add(text)
		whole.Finish()
		p := NewParser(fm)
		n := 1 + int(step)%7
		for i := 0; i < len(text); i += n {
			p.Add(text[i:min(i+n, len(text))])
		}
		p.Finish()
		if p.Content() != whole.Content() || len(p.Calls()) != len(whole.Calls()) {
			t.Fatalf("%s: pieces of %d: %q %d calls; whole: %q %d calls", fm.Name(), n, p.Content(), len(p.Calls()), whole.Content(), len(whole.Calls()))
		}
	})
}

// TestWrite: what a format writes for calls, its parser reads back.
func TestWrite(t *testing.T) {
	calls := []Call{{Name: "get_weather", Arguments: `{"city": "Paris", "days": 2}`}, {Name: "add", Arguments: `{"a": 1}`}}
	for _, f := range formats {
		p := NewParser(f)
		p.Add(f.Write(calls))
		p.Finish()
		got := p.Calls()
		if p.Content() != "" || len(got) != 2 || got[0].Name != "get_weather" || got[0].Arguments != calls[0].Arguments || got[1].Arguments != calls[1].Arguments {
			t.Errorf("%s: wrote %q, read %q and %+v", f.Name(), f.Write(calls), p.Content(), got)
		}
		// What a format writes for one call, its grammar takes (formats with one).
		one := f.Write([]Call{{Name: "get_weather", Arguments: `{"city": "Paris", "days": 2}`}})
		one = strings.TrimSuffix(one, "<|call|>") // harmony's: an end of generation, not text
		if g, err := f.Grammar([]Tool{weather, add}, false); err == nil && !g.Match([]byte(one)) && f.Name() != "generic" {
			t.Errorf("%s: the grammar refuses its own %q", f.Name(), one)
		}
		if sp := SystemPrompt(f, []Tool{weather}, Choice{}); !strings.Contains(sp, `"name": "get_weather"`) {
			t.Errorf("%s: system prompt %q names no tool", f.Name(), sp)
		}
	}
}

// TestRealTemplates: for each real chat template of tokenizer's tools goldens, Detect picks
// the format its template writes calls in, and that format's parser reads the calls back
// from the assistant turn the template rendered (what the model was trained to write).
func TestRealTemplates(t *testing.T) {
	for name, format := range map[string]string{
		"qwen3": "hermes", "qwen25": "hermes", "qwen3coder": "qwen3coder", "qwen35": "qwen3coder",
		"deepseek3": "deepseek", "deepseekv31": "deepseek3.1", "kimik2": "kimi", "mistralnemo": "mistral",
		"mistralsmall32": "mistral-v11", "llama31": "llama3", "glm47flash": "glm4.7", "qwen15": "generic",
	} {
		dir := filepath.Join("..", "tokenizer", "testdata", "chat")
		tmpl, err := os.ReadFile(filepath.Join(dir, name+".jinja"))
		if err != nil {
			t.Fatal(err)
		}
		f := Detect(string(tmpl))
		if f.Name() != format {
			t.Errorf("%s: detected %s, want %s", name, f.Name(), format)
			continue
		}
		if format == "generic" {
			continue
		}
		golden, err := os.ReadFile(filepath.Join(dir, name+".tools.txt"))
		if err != nil {
			t.Fatal(err)
		}
		// The assistant's turn: after the user's question, before the tools' results.
		turn := string(golden)
		turn = turn[strings.Index(turn, "what is 2+3?")+len("what is 2+3?"):]
		if i := strings.Index(turn, "21, \"sky\""); i >= 0 {
			turn = turn[:i]
		}
		p := NewParser(f)
		p.Add(turn)
		p.Finish()
		want := []Call{{Name: "get_weather", Arguments: `{"city": "Zürich", "unit": "celsius"}`}, {Name: "add", Arguments: `{"b": 3, "a": 2.5e-7}`}}
		if name == "llama31" {
			want = want[:1]
		}
		got := p.Calls()
		if len(got) != len(want) {
			t.Errorf("%s (%s): read %d calls from %q, want %d", name, format, len(got), turn, len(want))
			continue
		}
		for i := range want {
			var a, b any
			json.Unmarshal([]byte(got[i].Arguments), &a)
			json.Unmarshal([]byte(want[i].Arguments), &b)
			if got[i].Name != want[i].Name || !reflect.DeepEqual(a, b) {
				t.Errorf("%s (%s): call %d %s %s, want %s %s", name, format, i, got[i].Name, got[i].Arguments, want[i].Name, want[i].Arguments)
			}
		}
	}
}

// TestHarmonyReasoning: harmony's analysis channel is the answer's reasoning, apart from
// its text, streamed as it comes.
func TestHarmonyReasoning(t *testing.T) {
	f, _ := ByName("harmony")
	text := "<|channel|>analysis<|message|>The user greets; answer kindly.<|end|><|start|>assistant<|channel|>final<|message|>Hello!<|return|>"
	p := NewParser(f)
	var reasoning, content strings.Builder
	for i := 0; i < len(text); i += 3 {
		d := p.Add(text[i:min(i+3, len(text))])
		reasoning.WriteString(d.Reasoning)
		content.WriteString(d.Content)
	}
	d := p.Finish()
	reasoning.WriteString(d.Reasoning)
	content.WriteString(d.Content)
	if p.Reasoning() != "The user greets; answer kindly." || reasoning.String() != p.Reasoning() || p.Content() != "Hello!" || content.String() != "Hello!" {
		t.Errorf("reasoning %q (streamed %q), content %q (streamed %q)", p.Reasoning(), reasoning.String(), p.Content(), content.String())
	}
	if !Always(f) || Always(hermes{}) {
		t.Error("Always: harmony only")
	}
}
