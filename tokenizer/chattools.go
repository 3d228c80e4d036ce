package tokenizer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nikolalohinski/gonja/v2/exec"
)

// ToolCall is a function call an assistant turn made.
type ToolCall struct {
	ID   string
	Name string
	// Arguments is the call's arguments as JSON text (an object); text that is not JSON is
	// given to the template as a string.
	Arguments string
}

// ChatOptions are what a conversation is rendered with besides its messages.
type ChatOptions struct {
	// AddGenerationPrompt opens the assistant's turn.
	AddGenerationPrompt bool
	// Tools are the functions the model may call, each a JSON object as OpenAI's API writes
	// it ({"type": "function", "function": {"name": ..., "parameters": ...}}), handed to the
	// template as the variable tools with their keys in order.
	Tools []json.RawMessage
	// Vars are further template variables (Qwen3's enable_thinking), as JSON values.
	Vars map[string]json.RawMessage
	// Now is the time strftime_now tells templates (Llama's and Mistral's write the date);
	// zero: the clock's.
	Now time.Time
}

// ChatCaps is what the file's chat template does with tools, found by rendering probes as
// llama.cpp's minja does: templates differ in what they accept, and a value they cannot
// take either fails or, worse, renders as something else.
type ChatCaps struct {
	// Tools: the template writes the tools it is given.
	Tools bool
	// ToolCalls: it writes an assistant turn's tool calls.
	ToolCalls bool
	// ObjectArguments: it wants a call's arguments as an object (it applies tojson itself);
	// otherwise it is given the JSON text.
	ObjectArguments bool
	// NullContent: a tool-calling turn without text may have content none; otherwise it
	// gets "" (Qwen3's template tests '</think>' in content, which fails on none).
	NullContent bool
}

// toolTemplateVars are the variables a tool-aware template reads, built from ChatOptions.
func toolTemplateVars(o ChatOptions, vars map[string]any) error {
	if len(o.Tools) > 0 {
		tools := make(pyList, len(o.Tools))
		for i, raw := range o.Tools {
			v, err := orderedJSON(raw)
			if err != nil {
				return fmt.Errorf("tool %d: %w", i, err)
			}
			tools[i] = v
		}
		vars["tools"] = tools
	}
	for k, raw := range o.Vars {
		v, err := orderedJSON(raw)
		if err != nil {
			return fmt.Errorf("template variable %s: %w", k, err)
		}
		vars[k] = v
	}
	return nil
}

// messageVars is one message as a template sees it: role and content always, the tool
// calls of an assistant turn, the call id and function name a tool result answers. It is an
// ordered Dict, as a Python dict is: templates compare messages (Mistral's finds the last
// user message so), which gonja does for its Dicts and not for Go maps.
func messageVars(m Message, caps ChatCaps) *exec.Dict {
	var content any = m.Content
	if len(m.ToolCalls) > 0 && m.Content == "" && caps.NullContent {
		content = nil
	}
	d := &exec.Dict{Pairs: []*exec.Pair{pair("role", m.Role), pair("content", content)}}
	if len(m.ToolCalls) > 0 {
		calls := make(pyList, len(m.ToolCalls))
		for i, c := range m.ToolCalls {
			var args any = c.Arguments
			if caps.ObjectArguments {
				if o, err := orderedJSON([]byte(c.Arguments)); err == nil {
					args = o
				}
			}
			fn := &exec.Dict{Pairs: []*exec.Pair{pair("name", c.Name), pair("arguments", args)}}
			calls[i] = &exec.Dict{Pairs: []*exec.Pair{pair("id", c.ID), pair("type", "function"), pair("function", fn)}}
		}
		d.Pairs = append(d.Pairs, pair("tool_calls", calls))
	}
	if m.ToolCallID != "" {
		d.Pairs = append(d.Pairs, pair("tool_call_id", m.ToolCallID))
	}
	if m.Name != "" {
		d.Pairs = append(d.Pairs, pair("name", m.Name))
	}
	return d
}

func pair(k string, v any) *exec.Pair {
	return &exec.Pair{Key: exec.AsValue(k), Value: exec.AsValue(v)}
}

// orderedJSON decodes one JSON value for a template: objects as gonja dicts with their keys
// in the order written (what Python's json.loads keeps and tojson writes back), integers as
// int64 and other numbers as float64.
func orderedJSON(raw []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	v, err := decodeOrdered(d)
	if err != nil {
		return nil, err
	}
	if _, err := d.Token(); err != io.EOF {
		return nil, fmt.Errorf("more than one JSON value")
	}
	return v, nil
}

func decodeOrdered(d *json.Decoder) (any, error) {
	t, err := d.Token()
	if err != nil {
		return nil, err
	}
	switch t := t.(type) {
	case json.Delim:
		if t == '[' {
			list := pyList{}
			for d.More() {
				v, err := decodeOrdered(d)
				if err != nil {
					return nil, err
				}
				list = append(list, v)
			}
			_, err := d.Token()
			return list, err
		}
		dict := exec.NewDict()
		for d.More() {
			k, err := d.Token()
			if err != nil {
				return nil, err
			}
			v, err := decodeOrdered(d)
			if err != nil {
				return nil, err
			}
			dict.Pairs = append(dict.Pairs, pair(k.(string), v))
		}
		_, err := d.Token()
		return dict, err
	case json.Number:
		if i, err := strconv.ParseInt(string(t), 10, 64); err == nil {
			return i, nil
		}
		return strconv.ParseFloat(string(t), 64)
	}
	return t, nil
}

// filterToJSON is Hugging Face's tojson: Python's json.dumps with ensure_ascii off, keys in
// their order, ", " and ": " between items (", " becomes "," with an indent). gonja's own
// writes Go's compact encoding with sorted keys and <, > and & escaped, which is not what
// the model was trained to read.
func filterToJSON(_ *exec.Evaluator, in *exec.Value, params *exec.VarArgs) *exec.Value {
	indent := -1
	if v, ok := params.KwArgs["indent"]; ok && !v.IsNil() {
		if !v.IsInteger() {
			return exec.AsValue(fmt.Errorf("tojson: indent must be an integer, got %s", v.String()))
		}
		indent = v.Integer()
	}
	if len(params.Args) > 0 && !params.Args[0].IsNil() && params.Args[0].IsInteger() {
		indent = params.Args[0].Integer()
	}
	var b strings.Builder
	if err := writePyJSON(&b, in.Interface(), indent, 0); err != nil {
		return exec.AsValue(fmt.Errorf("tojson: %w", err))
	}
	return exec.AsSafeValue(b.String())
}

// writePyJSON writes v as Python's json.dumps(v, ensure_ascii=False, indent=indent) would
// (indent -1: None).
func writePyJSON(b *strings.Builder, v any, indent, depth int) error {
	if depth > 64 {
		return fmt.Errorf("nested deeper than 64 levels")
	}
	newline := func(d int) {
		if indent >= 0 {
			b.WriteByte('\n')
			b.WriteString(strings.Repeat(" ", indent*d))
		}
	}
	sep := ", "
	if indent >= 0 {
		sep = ","
	}
	switch v := v.(type) {
	case *exec.Value:
		return writePyJSON(b, v.Interface(), indent, depth)
	case nil:
		b.WriteString("null")
	case bool:
		b.WriteString(map[bool]string{true: "true", false: "false"}[v])
	case string:
		writePyString(b, v)
	case int:
		b.WriteString(strconv.Itoa(v))
	case int64:
		b.WriteString(strconv.FormatInt(v, 10))
	case float64:
		b.WriteString(pyFloat(v))
	case *exec.Dict:
		return writePyObject(b, v.Pairs, indent, depth, newline, sep)
	case exec.Dict:
		return writePyObject(b, v.Pairs, indent, depth, newline, sep)
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		pairs := make([]*exec.Pair, len(keys))
		for i, k := range keys {
			pairs[i] = pair(k, v[k])
		}
		return writePyObject(b, pairs, indent, depth, newline, sep)
	case pyList:
		return writePyJSON(b, []any(v), indent, depth)
	case []any:
		if len(v) == 0 {
			b.WriteString("[]")
			return nil
		}
		b.WriteByte('[')
		for i, e := range v {
			if i > 0 {
				b.WriteString(sep)
			}
			newline(depth + 1)
			if err := writePyJSON(b, e, indent, depth+1); err != nil {
				return err
			}
		}
		newline(depth)
		b.WriteByte(']')
	default:
		return writePyOther(b, v, indent, depth)
	}
	return nil
}

func writePyObject(b *strings.Builder, pairs []*exec.Pair, indent, depth int, newline func(int), sep string) error {
	if len(pairs) == 0 {
		b.WriteString("{}")
		return nil
	}
	b.WriteByte('{')
	for i, p := range pairs {
		if i > 0 {
			b.WriteString(sep)
		}
		newline(depth + 1)
		writePyString(b, p.Key.String())
		b.WriteString(": ")
		if err := writePyJSON(b, p.Value.Interface(), indent, depth+1); err != nil {
			return err
		}
	}
	newline(depth)
	b.WriteByte('}')
	return nil
}

// writePyOther writes the values a template builds itself (lists of gonja values, other
// integer and float types) by way of their plain Go form.
func writePyOther(b *strings.Builder, v any, indent, depth int) error {
	switch v := v.(type) {
	case []*exec.Value:
		list := make([]any, len(v))
		for i, e := range v {
			list[i] = e.Interface()
		}
		return writePyJSON(b, list, indent, depth)
	case exec.ValuesList:
		return writePyOther(b, []*exec.Value(v), indent, depth)
	case []string:
		list := make([]any, len(v))
		for i, e := range v {
			list[i] = e
		}
		return writePyJSON(b, list, indent, depth)
	case float32:
		return writePyJSON(b, float64(v), indent, depth)
	case int32, int16, int8, uint, uint8, uint16, uint32, uint64:
		fmt.Fprint(b, v)
		return nil
	}
	return fmt.Errorf("cannot write a %T as JSON", v)
}

// writePyString writes s as a JSON string the way Python does with ensure_ascii off: \n, \r,
// \t, \b and \f by name, other control characters as \u00XX, everything else as it is.
func writePyString(b *strings.Builder, s string) {
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			if r < 0x20 {
				fmt.Fprintf(b, `\u%04x`, r)
			} else if r == utf8.RuneError {
				b.WriteString("\ufffd")
			} else {
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
}

// pyFloat is Python's repr of a float: the shortest digits that read back, in positional
// notation with at least one decimal for exponents from -4 to 15, scientific beyond.
func pyFloat(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	e := strconv.FormatFloat(f, 'e', -1, 64) // d.ddde±XX
	mant, exps, _ := strings.Cut(e, "e")
	exp, _ := strconv.Atoi(exps)
	if exp < -4 || exp >= 16 {
		sign := "+"
		if exp < 0 {
			sign, exp = "-", -exp
		}
		return fmt.Sprintf("%se%s%02d", mant, sign, exp)
	}
	s := strconv.FormatFloat(f, 'f', -1, 64)
	if !strings.ContainsAny(s, ".") {
		s += ".0"
	}
	return s
}

// Probe names: unlikely in any template, so that finding them in a rendering means the
// template wrote what it was given.
const (
	probeFn  = "commit_run_probe_fn"
	probeArg = "commit_run_probe_arg"
)

// ChatCaps reports what the file's template does with tools (all false without one); found
// once, by rendering probes.
func (t *Tokenizer) ChatCaps() ChatCaps {
	t.capsOnce.Do(func() {
		if t.chatTemplate != "" {
			t.caps = probeCaps(t.chatTemplate, t.templateTokens())
		}
		_, err := renderJinja(t.chatTemplate, []Message{{Role: "user", Content: "Hello"}}, ChatOptions{}, ChatCaps{}, t.templateTokens())
		if format, _ := t.builtinFormat(ChatOptions{}); (t.chatTemplate == "" || err != nil) && format == "harmony" {
			// The built-in harmony format renders instead, and writes tools and calls.
			t.caps = ChatCaps{Tools: true, ToolCalls: true}
		}
	})
	return t.caps
}

func probeCaps(src string, tokens map[string]any) ChatCaps {
	render := func(msgs []Message, o ChatOptions, caps ChatCaps) string {
		out, err := renderJinja(src, msgs, o, caps, tokens)
		if err != nil {
			return ""
		}
		return out
	}
	var caps ChatCaps
	user := Message{Role: "user", Content: "Hello"}
	tool := json.RawMessage(`{"type": "function", "function": {"name": "` + probeFn + `", "description": "A probe.", ` +
		`"parameters": {"type": "object", "properties": {"` + probeArg + `": {"type": "integer"}}}}}`)
	caps.Tools = strings.Contains(render([]Message{user}, ChatOptions{Tools: []json.RawMessage{tool}}, caps), probeFn)
	// A nine-character id: Mistral's templates refuse any other.
	call := Message{Role: "assistant", ToolCalls: []ToolCall{{ID: "call00001", Name: probeFn, Arguments: `{"` + probeArg + `": 1}`}}}
	conv := []Message{user, call, {Role: "tool", Content: "2", ToolCallID: "call00001", Name: probeFn}}
	o := ChatOptions{Tools: []json.RawMessage{tool}}
	// The argument's name written, in whatever format, but not as gonja writes a dict it
	// was asked to add to a string (Python would have failed there).
	written := func(out string) bool {
		return strings.Contains(out, probeArg) && !strings.Contains(out, "'"+probeArg+"'")
	}
	// A turn of calls without text gets content "" where the template writes its calls so
	// (as Python would fail on none where a template tests content), none where only none
	// makes it write them (DeepSeek's); arguments as an object where the template writes
	// it as JSON, else as text.
	for _, try := range []ChatCaps{{ObjectArguments: true}, {}, {ObjectArguments: true, NullContent: true}, {NullContent: true}} {
		if written(render(conv, o, try)) {
			caps.ToolCalls, caps.ObjectArguments, caps.NullContent = true, try.ObjectArguments, try.NullContent
			break
		}
	}
	return caps
}
