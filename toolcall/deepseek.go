package toolcall

import (
	"strings"

	"github.com/commit-run/commit-run/grammar"
)

// deepseek is DeepSeek-V3's and R1's format: the calls between tool-calls tokens, each its
// type, the function's name and its arguments in a JSON code block; V3.1 writes the name
// and the arguments alone.
//
//	<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
//	```json
//	{"city": "Paris"}
//	```<｜tool▁call▁end｜><｜tool▁calls▁end｜>
type deepseek struct{}

func init() { register(deepseek{}) }

const (
	dsOpen      = "<｜tool▁calls▁begin｜>"
	dsClose     = "<｜tool▁calls▁end｜>"
	dsCallBegin = "<｜tool▁call▁begin｜>"
	dsCallEnd   = "<｜tool▁call▁end｜>"
	dsSep       = "<｜tool▁sep｜>"
	dsCode      = "\n```json\n"
	dsCodeEnd   = "\n```"
)

func (deepseek) Name() string { return "deepseek" }

func (deepseek) NewID() string { return "call_" + randomID(24) }

func (deepseek) Grammar(tools []Tool, parallel bool) (*grammar.Grammar, error) {
	return calls{open: dsOpen, prefix: dsCallBegin + "function" + dsSep, middle: dsCode,
		suffix: dsCodeEnd + dsCallEnd, sep: "\n", close: dsClose}.grammar("DeepSeek tool calls", tools, parallel)
}

func (deepseek) Write(calls []Call) string {
	return dsOpen + joinCalls(calls, dsCallBegin+"function"+dsSep+"%s"+dsCode+"%s"+dsCodeEnd+dsCallEnd, "\n") + dsClose
}

func (deepseek) Trigger() string { return dsOpen }

func (deepseek) starts() []string { return []string{dsOpen} }

func (deepseek) section(text string, final bool) (section, error) {
	body := text[len(dsOpen):]
	end := strings.Index(body, dsClose)
	if end >= 0 {
		body = body[:end]
	}
	var sec section
	parts := strings.Split(body, dsCallBegin)
	for i, part := range parts {
		if i == 0 {
			// Only space before the first call, or, while none has begun, the start of its
			// token or of the section's end.
			open := len(parts) == 1 && end < 0 && !final
			t := strings.TrimSpace(part)
			if t != "" && (!open || !strings.HasPrefix(dsCallBegin, t) && !strings.HasPrefix(dsClose, t)) {
				return section{}, errNoName
			}
			continue
		}
		c, err := deepseekCall(part)
		if err != nil {
			return section{}, err
		}
		if c.name == "" {
			break
		}
		sec.calls = append(sec.calls, c)
	}
	switch {
	case end >= 0:
		sec.n = len(dsOpen) + end + len(dsClose)
	case final && len(sec.calls) > 0 && sec.calls[len(sec.calls)-1].complete:
		sec.n = len(text)
	}
	return sec, nil
}

// deepseekCall reads one call, after its begin token.
func deepseekCall(s string) (partial, error) {
	done := strings.Index(s, dsCallEnd)
	if done >= 0 {
		s = s[:done]
	}
	sep := strings.Index(s, dsSep)
	if sep < 0 {
		return partial{}, nil
	}
	kind, rest := s[:sep], s[sep+len(dsSep):]
	var c partial
	if kind == "function" { // V3, R1: the name, then the arguments in a code block
		nl := strings.Index(rest, "\n")
		if nl < 0 {
			return partial{}, nil
		}
		c.name = strings.TrimSpace(rest[:nl])
		code := strings.Index(rest, dsCode)
		if code < 0 {
			return c, nil
		}
		rest = rest[code+len(dsCode):]
	} else { // V3.1: the name before the separator
		c.name = strings.TrimSpace(kind)
	}
	n, whole := valueEnd(rest)
	c.args = streamed(rest[:n])
	if whole && done >= 0 {
		c.args, c.complete = finalArgs(rest[:n]), true
	}
	return c, nil
}
