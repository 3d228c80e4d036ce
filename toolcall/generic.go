package toolcall

import (
	"encoding/json"
	"regexp"
	"strings"
	"unicode/utf8"

	"github.com/commit-run/commit-run/grammar"
)

// generic is the format for models whose template knows no tools: a system message
// (SystemPrompt) describes them, and the whole answer is held to JSON, either calls or a
// response, as llama.cpp's generic format does.
//
//	{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}
//	{"response": "It is sunny."}
type generic struct{}

func init() { register(generic{}) }

func (generic) Name() string { return "generic" }

func (generic) NewID() string { return "call_" + randomID(24) }

func (generic) Grammar(tools []Tool, parallel bool) (*grammar.Grammar, error) {
	return genericGrammar(tools, parallel, false)
}

// AnswerGrammar is the generic format's grammar for tool_choice auto: calls or a response.
func AnswerGrammar(tools []Tool, parallel bool) (*grammar.Grammar, error) {
	return genericGrammar(tools, parallel, true)
}

func genericGrammar(tools []Tool, parallel, respond bool) (*grammar.Grammar, error) {
	c := calls{open: `{"tool_calls": [`, prefix: `{"name": "`, middle: `", "arguments": `, suffix: "}", sep: ", ", close: "]}"}
	if !respond {
		return c.grammar("tool calls as JSON", tools, parallel)
	}
	if len(tools) == 0 {
		return nil, errNoTools
	}
	return grammar.Text("tool calls or a response as JSON", grammar.Lit(`{"`), grammar.OneOf(
		grammar.Alt{Lit: c.open[2:], Then: []grammar.Part{c.repeat(tools, parallel), grammar.Lit(c.close)}},
		grammar.Alt{Lit: `response": `, Then: []grammar.Part{grammar.Value([]byte(`{"type": "string"}`)), grammar.Lit("}")}},
	))
}

// genericPrompt describes the tools and the answer's JSON.
func genericPrompt(tools []Tool, choice Choice) string {
	var b strings.Builder
	b.WriteString("You can call these tools:\n")
	for _, t := range OpenAITools(tools) {
		b.WriteString("\n")
		b.Write(t)
	}
	b.WriteString("\n\nAnswer with JSON only. To call tools, write {\"tool_calls\": [{\"name\": <tool name>, \"arguments\": <arguments object>}")
	if choice.Parallel {
		b.WriteString(", ...")
	}
	b.WriteString("]}")
	if choice.Mode == Auto {
		b.WriteString("; to answer the user directly, write {\"response\": <your answer>}")
	}
	b.WriteString(".")
	return b.String()
}

func (generic) Write(calls []Call) string {
	return `{"tool_calls": [` + joinCalls(calls, `{"name": "%s", "arguments": %s}`, ", ") + "]}"
}

func (generic) starts() []string { return []string{"{"} }

var (
	genericCalls    = regexp.MustCompile(`^\s*\{\s*"tool_calls"\s*:\s*\[`)
	genericResponse = regexp.MustCompile(`^\s*\{\s*"response"\s*:\s*"`)
)

func (generic) section(text string, final bool) (section, error) {
	if m := genericResponse.FindString(text); m != "" {
		return genericAnswer(text, m)
	}
	m := genericCalls.FindString(text)
	if m == "" {
		if n, whole := valueEnd(text); whole || final {
			return section{}, errNoName // JSON of another shape: text
		} else if n > 40 {
			return section{}, errNoName
		}
		return section{}, nil
	}
	calls, end, closed, err := callArray(text, len(m))
	sec := section{calls: calls}
	switch rest := strings.TrimLeft(text[end:], " \t\r\n"); {
	case err != nil:
		return section{}, err
	case !closed:
		sec.n = end // open (0), or a broken list whose calls before it stand
	case strings.HasPrefix(rest, "}"):
		sec.n = len(text) - len(rest) + 1
	}
	return sec, nil
}

// genericAnswer reads {"response": "..."}: the string's text so far, whole characters
// and escapes only, and the section's end once the object closes.
func genericAnswer(text, m string) (section, error) {
	str := text[len(m)-1:]
	n, whole := valueEnd(str)
	if whole {
		var s string
		if err := json.Unmarshal([]byte(str[:n]), &s); err != nil {
			s = stringPrefix(str[1:]) // as far as it streamed: that stands
		}
		sec := section{content: s}
		if rest := strings.TrimLeft(str[n:], " \t\r\n"); strings.HasPrefix(rest, "}") {
			sec.n = len(text) - len(rest) + 1
		}
		return sec, nil
	}
	return section{content: stringPrefix(str[1:])}, nil
}

// stringPrefix decodes the start of a JSON string's body as far as it is whole: up to the
// first unfinished or broken escape, a high surrogate waiting for its pair, or invalid
// UTF-8, so that what it gives only grows as the string does.
func stringPrefix(body string) string {
	var b strings.Builder
	for i := 0; i < len(body); {
		c := body[i]
		switch {
		case c == '"' || c < 0x20:
			return b.String()
		case c == '\\':
			n := 2
			if i+1 < len(body) && body[i+1] == 'u' {
				n = 6
				if highSurrogate(body[:min(i+6, len(body))]) {
					n = 12
				}
			}
			var s string
			if i+n > len(body) || json.Unmarshal([]byte(`"`+body[i:i+n]+`"`), &s) != nil {
				return b.String()
			}
			b.WriteString(s)
			i += n
		default:
			r, n := utf8.DecodeRuneInString(body[i:])
			if r == utf8.RuneError && n <= 1 {
				return b.String()
			}
			b.WriteString(body[i : i+n])
			i += n
		}
	}
	return b.String()
}

// highSurrogate says whether s ends with the \u escape of a UTF-16 high surrogate.
func highSurrogate(s string) bool {
	if len(s) < 6 || s[len(s)-6] != '\\' || s[len(s)-5] != 'u' {
		return false
	}
	h := strings.ToLower(s[len(s)-4 : len(s)-2])
	return h >= "d8" && h <= "db"
}
