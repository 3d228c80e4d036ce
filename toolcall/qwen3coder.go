package toolcall

import (
	"encoding/json"
	"slices"
	"strings"

	"github.com/commit-run/commit-run/grammar"
)

// qwen3coder is Qwen3-Coder's and Qwen3.5's format: each call in <tool_call> tags as XML,
// its parameters' values as text (strings as they are, other values as JSON).
//
//	<tool_call>
//	<function=get_weather>
//	<parameter=city>
//	Paris
//	</parameter>
//	</function>
//	</tool_call>
//
// Its values are raw text: its Grammar holds a call to the tool's declared parameters, each
// value any text up to its closing tag (what a value means is the model's to get right).
type qwen3coder struct{}

func init() { register(qwen3coder{}) }

const (
	xmlFunction, xmlFunctionEnd   = "<function=", "</function>"
	xmlParameter, xmlParameterEnd = "<parameter=", "</parameter>"
)

func (qwen3coder) Name() string { return "qwen3coder" }

func (qwen3coder) NewID() string { return "call_" + randomID(24) }

// xmlValueMax bounds a parameter's value, in bytes.
const xmlValueMax = 16 << 10

func (qwen3coder) Grammar(tools []Tool, parallel bool) (*grammar.Grammar, error) {
	if len(tools) == 0 {
		return nil, errNoTools
	}
	end := xmlFunctionEnd + "\n" + hermesClose
	delim := "\n" + xmlParameterEnd + "\n"
	alts := make([]grammar.Alt, len(tools))
	for i, t := range tools {
		var params []grammar.Alt
		for _, p := range properties(t.Parameters) {
			params = append(params, grammar.Alt{Lit: xmlParameter + p.name + ">\n", Then: []grammar.Part{p.value(delim)}})
		}
		if len(params) == 0 { // no declared parameters: any name
			value := grammar.Until(delim, xmlValueMax)
			params = []grammar.Alt{{Lit: xmlParameter, Then: []grammar.Part{grammar.Until(">\n", 256), value}}}
		}
		alts[i] = grammar.Alt{Lit: t.Name + ">\n", Then: []grammar.Part{grammar.Loop(end, params...)}}
	}
	most := 1
	if parallel {
		most = -1
	}
	return grammar.Text("Qwen3-Coder tool calls", grammar.Repeat(1, most, "\n", grammar.Lit(hermesOpen+"\n"+xmlFunction), grammar.OneOf(alts...)))
}

// property is a declared parameter, the most bytes its value can take as text, and its
// enum's values as text.
type property struct {
	name     string
	maxBytes int
	enum     []string
}

// value is the grammar of the property's value as raw text up to and with delim: one of its
// enum's values, or any text its bound allows.
func (p property) value(delim string) grammar.Part {
	if len(p.enum) == 0 {
		return grammar.Until(delim, p.maxBytes+len(delim))
	}
	vals := make([]grammar.Alt, len(p.enum))
	for j, v := range p.enum {
		// The delimiter's last byte apart, so that no value's literal is empty after it.
		vals[j] = grammar.Alt{Lit: v + delim[:len(delim)-1], Then: []grammar.Part{grammar.Lit(delim[len(delim)-1:])}}
	}
	return grammar.OneOf(vals...)
}

// properties are a schema's declared properties, in order, each bounded by what its schema
// says of its length: a string's maxLength (4 bytes a character), an enum's longest value,
// a number's digits, a boolean's word; xmlValueMax otherwise.
func properties(schema json.RawMessage) []property {
	var s struct {
		Properties json.RawMessage `json:"properties"`
	}
	if json.Unmarshal(schema, &s) != nil {
		return nil
	}
	var out []property
	for _, kv := range argPairs(string(s.Properties)) {
		var p struct {
			Type      any   `json:"type"`
			MaxLength *int  `json:"maxLength"`
			Enum      []any `json:"enum"`
		}
		json.Unmarshal([]byte(kv[1]), &p)
		bound := xmlValueMax
		var enum []string
		switch {
		case len(p.Enum) > 0:
			bound = 0
			for _, e := range p.Enum {
				b, _ := json.Marshal(e)
				text := string(b)
				if s, ok := e.(string); ok {
					text = s
				}
				if !slices.Contains(enum, text) {
					enum = append(enum, text)
				}
				bound = max(bound, len(b))
			}
		case p.Type == "string" && p.MaxLength != nil && *p.MaxLength >= 0:
			bound = 4 * *p.MaxLength
		case p.Type == "integer" || p.Type == "number":
			bound = 40
		case p.Type == "boolean":
			bound = 5
		}
		out = append(out, property{name: kv[0], maxBytes: min(bound, xmlValueMax), enum: enum})
	}
	return out
}

func (qwen3coder) Trigger() string { return hermesOpen }

func (qwen3coder) Write(calls []Call) string {
	var b strings.Builder
	for i, c := range calls {
		if i > 0 {
			b.WriteString("\n")
		}
		b.WriteString(hermesOpen + "\n" + xmlFunction + c.Name + ">\n")
		for _, kv := range argPairs(c.Arguments) {
			b.WriteString(xmlParameter + kv[0] + ">\n" + kv[1] + "\n" + xmlParameterEnd + "\n")
		}
		b.WriteString(xmlFunctionEnd + "\n" + hermesClose)
	}
	return b.String()
}

func (qwen3coder) starts() []string { return []string{hermesOpen} }

func (qwen3coder) section(text string, final bool) (section, error) {
	body := strings.TrimLeft(text[len(hermesOpen):], " \t\r\n")
	if !strings.HasPrefix(body, xmlFunction) {
		if strings.HasPrefix(xmlFunction, body) && !final {
			return section{}, nil
		}
		return section{}, errNoName
	}
	rest := body[len(xmlFunction):]
	gt := strings.Index(rest, ">")
	if gt < 0 {
		if final || strings.ContainsAny(rest, "\n<") {
			return section{}, errNoName
		}
		return section{}, nil
	}
	c := partial{name: strings.TrimSpace(rest[:gt])}
	if !validName(c.name) {
		return section{}, errNoName
	}
	end := strings.Index(text, hermesClose)
	if end < 0 && !final {
		return section{calls: []partial{c}}, nil // the name streams; the arguments come whole
	}
	inner := rest[gt+1:]
	if i := strings.Index(inner, xmlFunctionEnd); i >= 0 {
		inner = inner[:i]
	}
	c.args, c.complete = xmlArgs(inner), true
	n := len(text)
	if end >= 0 {
		n = end + len(hermesClose)
	}
	return section{calls: []partial{c}, n: n}, nil
}

// xmlArgs reads <parameter=k>\nv\n</parameter> pairs into a JSON object, in order; one
// broken pair ends them (a call given out by its name stands).
func xmlArgs(s string) string {
	var b strings.Builder
	b.WriteByte('{')
	for i := 0; ; i++ {
		_, after, ok := strings.Cut(s, xmlParameter)
		if !ok {
			break
		}
		key, after, ok := strings.Cut(after, ">")
		if !ok {
			break
		}
		val, next, ok := strings.Cut(after, xmlParameterEnd)
		if !ok {
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		val = strings.TrimPrefix(strings.TrimSuffix(val, "\n"), "\n")
		b.WriteString(quote(strings.TrimSpace(key)) + ": " + glmValueJSON(val))
		s = next
	}
	b.WriteByte('}')
	return b.String()
}
