package toolcall

import (
	"strings"

	"github.com/commit-run/commit-run/grammar"
)

// hermes is Hermes' and Qwen's format (Qwen2.5, Qwen3, QwQ): each call a JSON object
// between <tool_call> and </tool_call>, on lines of their own.
//
//	<tool_call>
//	{"name": "get_weather", "arguments": {"city": "Paris"}}
//	</tool_call>
type hermes struct{}

func init() { register(hermes{}) }

const (
	hermesOpen  = "<tool_call>"
	hermesClose = "</tool_call>"
)

func (hermes) Name() string { return "hermes" }

func (hermes) NewID() string { return "call_" + randomID(24) }

func (hermes) Grammar(tools []Tool, parallel bool) (*grammar.Grammar, error) {
	return calls{prefix: hermesOpen + "\n{\"name\": \"", middle: `", "arguments": `,
		suffix: "}\n" + hermesClose, sep: "\n"}.grammar("Hermes tool calls", tools, parallel)
}

func (hermes) Write(calls []Call) string {
	return joinCalls(calls, hermesOpen+"\n{\"name\": \"%s\", \"arguments\": %s}\n"+hermesClose, "\n")
}

func (hermes) Trigger() string { return hermesOpen }

func (hermes) starts() []string { return []string{hermesOpen} }

func (hermes) section(text string, final bool) (section, error) {
	body := text[len(hermesOpen):]
	end := strings.Index(body, hermesClose)
	if end >= 0 {
		body = body[:end]
	}
	c, n, err := callObject(body)
	switch {
	case err != nil:
		return section{}, err
	case end >= 0 && c.name == "":
		return section{}, errNoName // closed around something that is not a call
	case end >= 0:
		c.complete = true // broken arguments stay as written: see callObject
		return section{calls: []partial{c}, n: len(hermesOpen) + end + len(hermesClose)}, nil
	case final && n > 0:
		return section{calls: []partial{c}, n: len(text)}, nil // the model ended without the close
	}
	if c.name == "" {
		return section{}, nil
	}
	return section{calls: []partial{c}}, nil
}
