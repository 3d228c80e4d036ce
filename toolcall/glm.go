package toolcall

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/commit-run/commit-run/grammar"
)

// glm is GLM-4.5's and GLM-4.7's format: the function's name, then each argument's key and
// value in tags, strings as they are and other values as JSON.
//
//	<tool_call>get_weather
//	<arg_key>city</arg_key>
//	<arg_value>Paris</arg_value>
//	</tool_call>
//
// Its values are raw text: its Grammar holds a call to the tool's declared arguments, as
// Qwen3-Coder's does. GLM-4.7 writes the same tags with no line breaks (glm47).
type glm struct{}

func init() { register(glm{}) }

const (
	glmKey, glmKeyEnd     = "<arg_key>", "</arg_key>"
	glmValue, glmValueEnd = "<arg_value>", "</arg_value>"
)

func (glm) Name() string { return "glm4.5" }

func (glm) NewID() string { return "call_" + randomID(24) }

func (glm) Grammar(tools []Tool, parallel bool) (*grammar.Grammar, error) {
	return glmGrammar(tools, parallel, "\n")
}

func (glm) Trigger() string { return hermesOpen }

// glmGrammar is GLM's calls with nl after the name and each tag ("\n" for GLM-4.5 and 4.6,
// "" for 4.7). The name's literal takes the "<" of what follows it, so that no tool's name
// is the start of another's.
func glmGrammar(tools []Tool, parallel bool, nl string) (*grammar.Grammar, error) {
	if len(tools) == 0 {
		return nil, errNoTools
	}
	alts := make([]grammar.Alt, len(tools))
	for i, t := range tools {
		var args []grammar.Alt
		for _, p := range properties(t.Parameters) {
			args = append(args, grammar.Alt{Lit: glmKey[1:] + p.name + glmKeyEnd + nl + glmValue, Then: []grammar.Part{p.value(glmValueEnd + nl + "<")}})
		}
		if len(args) == 0 { // no declared arguments: any key
			args = []grammar.Alt{{Lit: glmKey[1:], Then: []grammar.Part{grammar.Until(glmKeyEnd+nl+glmValue, 256),
				grammar.Until(glmValueEnd+nl+"<", xmlValueMax)}}}
		}
		alts[i] = grammar.Alt{Lit: t.Name + nl + "<", Then: []grammar.Part{grammar.Loop(hermesClose[1:], args...)}}
	}
	most := 1
	if parallel {
		most = -1
	}
	return grammar.Text("GLM tool calls", grammar.Repeat(1, most, "\n", grammar.Lit(hermesOpen), grammar.OneOf(alts...)))
}

// glm47 is GLM-4.7's form of GLM's format: no line breaks.
//
//	<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>
type glm47 struct{ glm }

func init() { register(glm47{}) }

func (glm47) Name() string { return "glm4.7" }

func (glm47) Grammar(tools []Tool, parallel bool) (*grammar.Grammar, error) {
	return glmGrammar(tools, parallel, "")
}

func (glm47) Write(calls []Call) string {
	var b strings.Builder
	for i, c := range calls {
		if i > 0 {
			b.WriteString("\n")
		}
		b.WriteString(hermesOpen + c.Name)
		for _, kv := range argPairs(c.Arguments) {
			b.WriteString(glmKey + kv[0] + glmKeyEnd + glmValue + kv[1] + glmValueEnd)
		}
		b.WriteString(hermesClose)
	}
	return b.String()
}

// Write gives each argument its tags, strings as they are; arguments that are not a JSON
// object are left out.
func (glm) Write(calls []Call) string {
	var b strings.Builder
	for i, c := range calls {
		if i > 0 {
			b.WriteString("\n")
		}
		b.WriteString(hermesOpen + c.Name + "\n")
		for _, kv := range argPairs(c.Arguments) {
			b.WriteString(glmKey + kv[0] + glmKeyEnd + "\n" + glmValue + kv[1] + glmValueEnd + "\n")
		}
		b.WriteString(hermesClose)
	}
	return b.String()
}

// argPairs are a JSON object's keys and values as XML-style formats write them: strings as
// they are, other values as JSON; none for text that is not an object.
func argPairs(args string) [][2]string {
	var out [][2]string
	d := json.NewDecoder(strings.NewReader(args))
	if t, err := d.Token(); err != nil || t != json.Delim('{') {
		return nil
	}
	for d.More() {
		k, err := d.Token()
		var v json.RawMessage
		if err != nil || d.Decode(&v) != nil {
			break
		}
		val := string(v)
		var str string
		if json.Unmarshal(v, &str) == nil {
			val = str
		}
		out = append(out, [2]string{fmt.Sprint(k), val})
	}
	return out
}

func (glm) starts() []string { return []string{hermesOpen} }

func (glm) section(text string, final bool) (section, error) {
	body := text[len(hermesOpen):]
	end := strings.Index(body, hermesClose)
	if end < 0 {
		// The name streams once its line ends; the arguments come whole.
		if nl := strings.IndexAny(body, "\n<"); nl > 0 && !final {
			if name := strings.TrimSpace(body[:nl]); validName(name) {
				return section{calls: []partial{{name: name}}}, nil
			}
			return section{}, errNoName
		}
		if !final {
			return section{}, nil
		}
	} else {
		body = body[:end]
	}
	c, err := glmCall(body)
	if err != nil {
		return section{}, err
	}
	n := len(text)
	if end >= 0 {
		n = len(hermesOpen) + end + len(hermesClose)
	}
	return section{calls: []partial{c}, n: n}, nil
}

// glmCall reads a whole call's body into a name and a JSON object of its arguments, in the
// order written.
func glmCall(body string) (partial, error) {
	name := body
	if i := strings.IndexAny(body, "\n<"); i >= 0 {
		name = body[:i] // as it streamed: the first line
	}
	_, rest, _ := strings.Cut(body, glmKey)
	c := partial{name: strings.TrimSpace(name), complete: true}
	if !validName(c.name) {
		return partial{}, errNoName
	}
	var b strings.Builder
	b.WriteByte('{')
	// A call given out by its name stands: arguments past a broken tag are dropped.
	for i := 0; rest != ""; i++ {
		key, after, ok := strings.Cut(rest, glmKeyEnd)
		if !ok {
			break
		}
		_, after, _ = strings.Cut(after, glmValue)
		val, next, ok := strings.Cut(after, glmValueEnd)
		if !ok {
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(quote(strings.TrimSpace(key)) + ": " + glmValueJSON(val))
		_, rest, _ = strings.Cut(next, glmKey)
	}
	b.WriteByte('}')
	c.args = b.String()
	return c, nil
}

// glmValueJSON is a value as JSON: what parses as a JSON object, array, number, boolean
// or null is that; anything else is a string.
func glmValueJSON(v string) string {
	t := strings.TrimSpace(v)
	if t != "" && t[0] != '"' && json.Valid([]byte(t)) {
		return t
	}
	return quote(v)
}
