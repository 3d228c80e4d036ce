package toolcall

import (
	"fmt"
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
// Its values are raw text, which the JSON grammar cannot describe, so it has no Grammar.
type qwen3coder struct{}

func init() { register(qwen3coder{}) }

const (
	xmlFunction, xmlFunctionEnd   = "<function=", "</function>"
	xmlParameter, xmlParameterEnd = "<parameter=", "</parameter>"
)

func (qwen3coder) Name() string { return "qwen3coder" }

func (qwen3coder) NewID() string { return "call_" + randomID(24) }

func (qwen3coder) Grammar([]Tool, bool) (*grammar.Grammar, error) {
	return nil, fmt.Errorf("toolcall: Qwen3-Coder's and Qwen3.5's tool calls write strings as raw text, which the grammar cannot hold a model to; use tool_choice auto")
}

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
