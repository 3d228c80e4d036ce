package toolcall

import (
	"strings"

	"github.com/commit-run/commit-run/grammar"
)

// llama3 is Llama 3.1's to 3.3's format for the tools its template describes: a JSON object
// naming the function and its "parameters", as the whole answer, after <|python_tag|> or
// alone.
//
//	{"name": "get_weather", "parameters": {"city": "Paris"}}
type llama3 struct{}

func init() { register(llama3{}) }

const llamaTag = "<|python_tag|>"

func (llama3) Name() string { return "llama3" }

func (llama3) NewID() string { return "call_" + randomID(24) }

func (llama3) Grammar(tools []Tool, parallel bool) (*grammar.Grammar, error) {
	// Llama 3 makes one call a turn.
	return calls{prefix: `{"name": "`, middle: `", "parameters": `, suffix: "}", sep: "\n"}.grammar("Llama 3 tool call", tools, false)
}

func (llama3) Write(calls []Call) string {
	return joinCalls(calls, `{"name": "%s", "parameters": %s}`, "\n")
}

func (llama3) starts() []string { return []string{llamaTag, `{"name"`} }

func (llama3) section(text string, final bool) (section, error) {
	body := strings.TrimPrefix(text, llamaTag)
	c, n, err := callObject(body)
	switch {
	case err != nil:
		return section{}, err
	case n > 0:
		return section{calls: []partial{c}, n: len(text) - len(body) + n}, nil
	case c.name != "":
		return section{calls: []partial{c}}, nil
	}
	return section{}, nil
}
