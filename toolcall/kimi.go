package toolcall

import (
	"strconv"
	"strings"

	"github.com/commit-run/commit-run/grammar"
)

// kimi is Kimi K2's format: the calls between section tokens, each named by an id
// "functions.<name>:<index>", its arguments JSON.
//
//	<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>
type kimi struct{}

func init() { register(kimi{}) }

const (
	kimiOpen      = "<|tool_calls_section_begin|>"
	kimiClose     = "<|tool_calls_section_end|>"
	kimiCallBegin = "<|tool_call_begin|>"
	kimiArgs      = "<|tool_call_argument_begin|>"
	kimiCallEnd   = "<|tool_call_end|>"
)

func (kimi) Name() string { return "kimi" }

func (kimi) NewID() string { return "call_" + randomID(24) }

// Grammar holds the model to one call: its section's end and another call's begin share
// their first bytes, which the grammar's repetition cannot tell apart.
func (kimi) Grammar(tools []Tool, _ bool) (*grammar.Grammar, error) {
	if len(tools) == 0 {
		return nil, errNoTools
	}
	alts := make([]grammar.Alt, len(tools))
	for i, t := range tools {
		alts[i] = grammar.Alt{Lit: t.Name + ":", Then: []grammar.Part{grammar.Value([]byte(`{"type": "integer"}`)),
			grammar.Lit(kimiArgs), arguments(t), grammar.Lit(kimiCallEnd + kimiClose)}}
	}
	return grammar.Text("Kimi tool call", grammar.Lit(kimiOpen+kimiCallBegin+"functions."), grammar.OneOf(alts...))
}

func (kimi) Write(calls []Call) string {
	var b strings.Builder
	b.WriteString(kimiOpen)
	for i, c := range calls {
		b.WriteString(kimiCallBegin + "functions." + c.Name + ":" + strconv.Itoa(i) + kimiArgs + c.Arguments + kimiCallEnd)
	}
	return b.String() + kimiClose
}

func (kimi) Trigger() string { return kimiOpen }

func (kimi) starts() []string { return []string{kimiOpen} }

func (kimi) section(text string, final bool) (section, error) {
	body := text[len(kimiOpen):]
	end := strings.Index(body, kimiClose)
	if end >= 0 {
		body = body[:end]
	}
	var sec section
	parts := strings.Split(body, kimiCallBegin)
	if t := strings.TrimSpace(parts[0]); t != "" && (len(parts) > 1 || end >= 0 || final || !strings.HasPrefix(kimiCallBegin, t) && !strings.HasPrefix(kimiClose, t)) {
		return section{}, errNoName
	}
	for _, part := range parts[1:] {
		id, rest, ok := strings.Cut(part, kimiArgs)
		if !ok {
			break
		}
		name := strings.TrimPrefix(strings.TrimSpace(id), "functions.")
		if i := strings.LastIndex(name, ":"); i >= 0 {
			name = name[:i]
		}
		if !validName(name) {
			return section{}, errNoName
		}
		c := partial{name: name}
		done := strings.Index(rest, kimiCallEnd)
		if done >= 0 {
			rest = rest[:done]
		}
		n, whole := valueEnd(rest)
		c.args = streamed(rest[:n])
		if whole && done >= 0 {
			c.args, c.complete = finalArgs(rest[:n]), true
		}
		sec.calls = append(sec.calls, c)
	}
	switch {
	case end >= 0:
		sec.n = len(kimiOpen) + end + len(kimiClose)
	case final && len(sec.calls) > 0 && sec.calls[len(sec.calls)-1].complete:
		sec.n = len(text)
	}
	return sec, nil
}
