package toolcall

import (
	"strings"

	"github.com/commit-run/commit-run/grammar"
)

// mistral is Mistral's format: [TOOL_CALLS] then a JSON array of call objects (Mistral 7B
// v0.3, Nemo, Small 3), or, from the v11 tokenizer on (Small 3.2, Magistral), each call as
// [TOOL_CALLS]name[ARGS]{...}. Its templates refuse call ids that are not 9 letters or
// digits.
//
//	[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]
type mistral struct{}

func init() { register(mistral{}) }

const (
	mistralOpen = "[TOOL_CALLS]"
	mistralArgs = "[ARGS]"
)

func (mistral) Name() string { return "mistral" }

func (mistral) NewID() string { return randomID(9) }

func (mistral) Grammar(tools []Tool, parallel bool) (*grammar.Grammar, error) {
	return calls{open: mistralOpen + "[", prefix: `{"name": "`, middle: `", "arguments": `,
		suffix: "}", sep: ", ", close: "]"}.grammar("Mistral tool calls", tools, parallel)
}

func (mistral) Write(calls []Call) string {
	return mistralOpen + "[" + joinCalls(calls, `{"name": "%s", "arguments": %s}`, ", ") + "]"
}

func (mistral) starts() []string { return []string{mistralOpen} }

func (mistral) section(text string, final bool) (section, error) {
	body := text[len(mistralOpen):]
	trimmed := strings.TrimLeft(body, " \t\r\n")
	if trimmed == "" {
		return section{}, nil
	}
	if trimmed[0] != '[' {
		return mistralNamed(body, len(mistralOpen), final)
	}
	calls, end, _, err := callArray(text, len(text)-len(trimmed)+1)
	return section{calls: calls, n: end}, err
}

// mistralNamed reads the v11 form: name[ARGS]{...}.
func mistralNamed(body string, off int, final bool) (section, error) {
	i := strings.Index(body, mistralArgs)
	if i < 0 {
		// Still the name, perhaps with the start of [CALL_ID] or [ARGS] after it.
		name, tag, _ := strings.Cut(body, "[")
		if name = strings.TrimSpace(name); final || name != "" && !validName(name) || len(tag) > 80 {
			return section{}, errNoName
		}
		return section{}, nil
	}
	name, _, _ := strings.Cut(body[:i], "[CALL_ID]") // Magistral may write the call's id too
	name = strings.TrimSpace(name)
	if !validName(name) {
		return section{}, errNoName
	}
	args := body[i+len(mistralArgs):]
	n, whole := valueEnd(args)
	c := partial{name: name, args: streamed(args[:n])}
	if !whole {
		return section{calls: []partial{c}}, nil
	}
	c.args, c.complete = finalArgs(args[:n]), true
	return section{calls: []partial{c}, n: off + i + len(mistralArgs) + n}, nil
}
