package toolcall

import (
	"strings"

	"github.com/commit-run/commit-run/grammar"
)

// deepseek31 is DeepSeek-V3.1's form of DeepSeek's format: the name and the arguments
// alone around the separator, no code block, calls not split by lines.
//
//	<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>
type deepseek31 struct{ deepseek }

func init() { register(deepseek31{}) }

func (deepseek31) Name() string { return "deepseek3.1" }

func (deepseek31) Grammar(tools []Tool, parallel bool) (*grammar.Grammar, error) {
	return calls{open: dsOpen + dsCallBegin, middle: dsSep, suffix: dsCallEnd, sep: dsCallBegin,
		close: dsClose}.grammar("DeepSeek-V3.1 tool calls", tools, parallel)
}

func (deepseek31) Write(calls []Call) string {
	return dsOpen + joinCalls(calls, dsCallBegin+"%s"+dsSep+"%s"+dsCallEnd, "") + dsClose
}

// mistralV11 is the form of Mistral's format from its v11 tokenizer on (Small 3.2,
// Magistral, Devstral): each call [TOOL_CALLS]name[ARGS]{...}.
type mistralV11 struct{ mistral }

func init() { register(mistralV11{}) }

func (mistralV11) Name() string { return "mistral-v11" }

func (mistralV11) Grammar(tools []Tool, parallel bool) (*grammar.Grammar, error) {
	return calls{open: mistralOpen, middle: mistralArgs, sep: mistralOpen}.grammar("Mistral v11 tool calls", tools, parallel)
}

func (mistralV11) Write(calls []Call) string {
	return joinCalls(calls, mistralOpen+"%s"+mistralArgs+"%s", "")
}

// isV31 says whether a DeepSeek template writes V3.1's calls: the name, then the separator.
func isV31(template string) bool {
	i := strings.Index(template, "<｜tool▁sep｜>")
	for i >= 0 {
		before := strings.TrimRight(template[:i], " +'\"")
		if strings.HasSuffix(before, "['name']") || strings.HasSuffix(before, ".name") {
			return true
		}
		j := strings.Index(template[i+1:], "<｜tool▁sep｜>")
		if j < 0 {
			break
		}
		i += 1 + j
	}
	return false
}
