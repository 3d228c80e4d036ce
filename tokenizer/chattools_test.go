package tokenizer

import (
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// oaiMessage is a message as OpenAI's API writes it, which testdata/chat/tools.json uses.
type oaiMessage struct {
	Role       string `json:"role"`
	Content    string `json:"content"`
	ToolCallID string `json:"tool_call_id"`
	Name       string `json:"name"`
	ToolCalls  []struct {
		ID       string `json:"id"`
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	} `json:"tool_calls"`
}

// TestChatTools renders a conversation with tools, parallel tool calls and their results
// with the real templates of our families, compares with testdata/chat/<name>.tools.txt
// (-update rewrites them; tools/tokgolden/chat_check.py checks them against Python's
// jinja2 with Hugging Face's tojson), and checks the capabilities the probes find.
func TestChatTools(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("testdata", "chat", "tools.json"))
	if err != nil {
		t.Fatal(err)
	}
	var tc struct {
		Tools    []json.RawMessage `json:"tools"`
		Messages []oaiMessage      `json:"messages"`
		Cases    []struct {
			Name, GGUF, BOS, EOS string
			Caps                 ChatCaps
			// Single: the template allows one call a turn (Llama 3.1's): the second call
			// and its result are left out.
			Single bool
		} `json:"cases"`
	}
	if err := json.Unmarshal(b, &tc); err != nil {
		t.Fatal(err)
	}
	msgs := make([]Message, len(tc.Messages))
	for i, m := range tc.Messages {
		msgs[i] = Message{Role: m.Role, Content: m.Content, ToolCallID: m.ToolCallID, Name: m.Name}
		for _, c := range m.ToolCalls {
			msgs[i].ToolCalls = append(msgs[i].ToolCalls, ToolCall{ID: c.ID, Name: c.Function.Name, Arguments: c.Function.Arguments})
		}
	}
	for _, c := range tc.Cases {
		t.Run(c.Name, func(t *testing.T) {
			src, err := os.ReadFile(filepath.Join("testdata", "chat", c.Name+".jinja"))
			if err != nil {
				t.Fatal(err)
			}
			tok := chatTokenizer(t, c.GGUF, string(src), "", nil)
			if got := tok.ChatCaps(); got != c.Caps {
				t.Errorf("caps %+v, want %+v", got, c.Caps)
			}
			conv := msgs
			if c.Single {
				conv = singleCall(msgs)
			}
			p, err := tok.RenderChatWith(conv, ChatOptions{AddGenerationPrompt: true, Tools: tc.Tools, Now: toolsNow})
			if err != nil || p.Source != SourceGGUF {
				t.Fatalf("render: %v (source %s, template error %v)", err, p.Source, p.TemplateErr)
			}
			checkChatGolden(t, c.Name+".tools.txt", p.Text)
		})
	}
}

// toolsNow is the date the tools goldens are rendered on (chat_check.py's too).
var toolsNow = time.Date(2026, 1, 2, 15, 4, 5, 0, time.UTC)

// singleCall leaves out every call but each turn's first, and the results of those left out.
func singleCall(msgs []Message) []Message {
	var out []Message
	dropped := map[string]bool{}
	for _, m := range msgs {
		if len(m.ToolCalls) > 1 {
			for _, c := range m.ToolCalls[1:] {
				dropped[c.ID] = true
			}
			m.ToolCalls = m.ToolCalls[:1]
		}
		if !dropped[m.ToolCallID] || m.ToolCallID == "" {
			out = append(out, m)
		}
	}
	return out
}

// TestPyJSON: tojson writes what Python's json.dumps(ensure_ascii=False) writes.
func TestPyJSON(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`{"b": 1, "a": [1.5, 2e-7, 1e16, 1e15, 100.0, -0.0, true, null, "x<y>&\u0001\n\"é"]}`,
			`{"b": 1, "a": [1.5, 2e-07, 1e+16, 1000000000000000.0, 100.0, -0.0, true, null, "x<y>&\u0001\n\"é"]}`},
		{`{}`, `{}`},
		{`[]`, `[]`},
		{`12345678901234567890`, `1.2345678901234567e+19`},
	} {
		v, err := orderedJSON([]byte(c.in))
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		if err := writePyJSON(&b, v, -1, 0); err != nil {
			t.Fatal(err)
		}
		if b.String() != c.want {
			t.Errorf("%s: got %s, want %s", c.in, b.String(), c.want)
		}
	}
	if got := pyFloat(math.Inf(1)); got != "Infinity" {
		t.Errorf("inf: %s", got)
	}
}

// TestChatGoldensAgainstJinja2 runs tools/tokgolden/chat_check.py, which renders every chat
// golden with Python's jinja2 as Hugging Face's apply_chat_template does: the reference
// engine the templates were written for.
func TestChatGoldensAgainstJinja2(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 is not installed")
	}
	if err := exec.Command(py, "-c", "import jinja2").Run(); err != nil {
		t.Skip("python3 has no jinja2")
	}
	out, err := exec.Command(py, filepath.Join("..", "tools", "tokgolden", "chat_check.py"), filepath.Join("testdata", "chat")).CombinedOutput()
	if err != nil {
		t.Fatalf("chat_check.py: %v\n%s", err, out)
	}
}

// TestHarmony: gpt-oss's built-in format writes what Python's jinja2 renders from the
// template gpt-oss files carry (testdata/chat/gptoss.jinja, which gonja cannot parse): the
// plain conversation of cases.json, and one with a tool call and its results.
// chat_check.py renders the template to check the goldens.
func TestHarmony(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("testdata", "chat", "gptoss.jinja"))
	if err != nil {
		t.Fatal(err)
	}
	tok := chatTokenizer(t, "qwen3.gguf.gz", string(src), "gpt-oss", nil)
	var tc struct {
		Messages []oaiMessage `json:"messages"`
	}
	b, err := os.ReadFile(filepath.Join("testdata", "chat", "tools.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &tc); err != nil {
		t.Fatal(err)
	}
	var calls []Message
	for _, m := range tc.Messages {
		msg := Message{Role: m.Role, Content: m.Content, ToolCallID: m.ToolCallID, Name: m.Name}
		for _, c := range m.ToolCalls {
			msg.ToolCalls = append(msg.ToolCalls, ToolCall{ID: c.ID, Name: c.Function.Name, Arguments: c.Function.Arguments})
		}
		calls = append(calls, msg)
	}
	var withTools struct {
		Tools []json.RawMessage `json:"tools"`
	}
	if err := json.Unmarshal(b, &withTools); err != nil {
		t.Fatal(err)
	}
	if caps := tok.ChatCaps(); !caps.Tools || !caps.ToolCalls {
		t.Errorf("harmony's caps %+v: the built-in format writes tools and calls", caps)
	}
	for name, msgs := range map[string][]Message{"gptoss.txt": readChatCases(t).Messages, "gptoss.tools.txt": singleCall(calls)} {
		o := ChatOptions{AddGenerationPrompt: true, Now: toolsNow}
		if name == "gptoss.tools.txt" {
			o.Tools = withTools.Tools
		}
		p, err := tok.RenderChatWith(msgs, o)
		if err != nil || p.Source != SourceBuiltin || p.Format != "harmony" || p.TemplateErr == nil {
			t.Fatalf("%s: %v, source %s %s, template error %v", name, err, p.Source, p.Format, p.TemplateErr)
		}
		checkChatGolden(t, name, p.Text)
	}
}

// TestHarmonyToolTypes: the TypeScript gpt-oss's template writes for arrays, nested objects
// (with the line break and indentation its source leaves), nullable strings and defaults, as
// Python's jinja2 renders it from the template.
func TestHarmonyToolTypes(t *testing.T) {
	tool := json.RawMessage(`{"type": "function", "function": {"name": "f", "description": "F.", "parameters": {"type": "object", "properties": {
		"xs": {"type": "array", "items": {"type": "string"}}, "o": {"type": "object", "properties": {"k": {"type": "string"}}, "required": ["k"]},
		"n": {"type": "string", "nullable": true, "default": "x"}}}}}`)
	want := "# Tools\n\n## functions\n\nnamespace functions {\n\n// F.\ntype f = (_: {\nxs?: string[],\no?: {\nk: \n                string},\n" +
		"n?: string | null, // default: \"x\",\n}) => any;\n\n} // namespace functions"
	if got := harmonyTools([]json.RawMessage{tool}); got != want {
		t.Errorf("got\n%q\nwant\n%q", got, want)
	}
}

// TestJinjaPython: what templates do that gonja v2.9.1 did otherwise than Python's Jinja:
// a list's first item as [-len] (a one-message chat's messages[-1], a split of a text
// without the separator, a filtered list), dicts' methods and items filter in key order,
// and dicts compared.
func TestJinjaPython(t *testing.T) {
	msgs := []Message{{Role: "user", Content: "no think here"}}
	for _, c := range []struct{ src, want string }{
		{`{{ messages[-1].content }}`, "no think here"},
		{`{{ messages[0].content.split('</think>')[-1].lstrip('\n') }}`, "no think here"},
		{`{{ (messages | selectattr("role", "equalto", "user") | list)[-1].role }}`, "user"},
		{`{{ messages[0] == (messages | list)[-1] }}`, "True"},
		{`{% for k, v in messages[0].items() %}{{ k }};{% endfor %}`, "role;content;"},
		{`{% for k, v in messages[0] | items %}{{ k }};{% endfor %}`, "role;content;"},
		{`{{ messages[0].keys() | join(",") }}`, "role,content"},
		{`{{ messages[0].get("content") }}`, "no think here"},
		{`{{ {"b": 1, "a": [1, 2.5, "x<y"]} | tojson }}`, `{"b": 1, "a": [1, 2.5, "x<y"]}`},
	} {
		out, err := renderJinja(c.src, msgs, ChatOptions{}, ChatCaps{}, map[string]any{})
		if err != nil || out != c.want {
			t.Errorf("%s: %q, %v; want %q", c.src, out, err, c.want)
		}
	}
}
