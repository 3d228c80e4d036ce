package server

import (
	"encoding/json"
	"testing"

	"github.com/commit-run/commit-run/toolcall"
)

// FuzzChatToolFields: any chat body's messages, tools and tool_choice are read without a
// panic, into a clear error or tools that pass toolcall's checks and whose grammar, where
// one is asked for, compiles or fails with an error.
func FuzzChatToolFields(f *testing.F) {
	for _, s := range []string{
		`{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "number"}}}}}], "tool_choice": "required"}`,
		`{"messages": [{"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}, {"role": "tool", "tool_call_id": "c", "content": "1"}]}`,
		`{"messages": [], "tools": [{"type": "function", "function": {"name": "g"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}, "parallel_tool_calls": false}`,
		`{"tools": "x", "tool_choice": 3}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var q chatRequest
		if json.Unmarshal(body, &q) != nil {
			return
		}
		chatMessages(q.Messages)
		tools, choice, err := openaiTools(&q)
		if err != nil || len(tools) == 0 {
			return
		}
		if toolcall.Validate(tools) != nil {
			return
		}
		selected, serr := toolcall.Select(tools, choice)
		if serr != nil || len(selected) == 0 {
			return
		}
		for _, name := range []string{"hermes", "mistral", "deepseek", "generic"} {
			fm, _ := toolcall.ByName(name)
			fm.Grammar(selected, choice.Parallel)
		}
		toolcall.AnswerGrammar(selected, choice.Parallel)
	})
}
