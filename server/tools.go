package server

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/ollama/ollama/api"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/grammar"
	"github.com/commit-run/commit-run/toolcall"
)

// tooling is one chat's tools: what the template is given, the format the model writes its
// calls in, and the grammar a required call is held to. nil: no tools, and a format whose
// answers are plain text.
type tooling struct {
	chat    engine.ChatOptions
	format  toolcall.Format
	grammar *grammar.Grammar
	trigger string // the grammar holds from this text on ("": from the start)
}

// newTooling checks a chat's tools and choice against the model: the format its template
// writes calls in and, where the choice requires a call (or the template knows no tools),
// the grammar. No tools, or tool_choice none, is nil.
func (s *Server) newTooling(tools []engine.Tool, choice engine.ToolChoice) (*tooling, error) {
	if len(tools) == 0 || choice.Mode == toolcall.None {
		if f := s.model.ToolFormat(); toolcall.Always(f) {
			return &tooling{format: f}, nil // a harmony answer is read for its channels all the same
		}
		return nil, nil
	}
	if err := toolcall.Validate(tools); err != nil {
		return nil, err
	}
	o := engine.ChatOptions{Tools: tools, Choice: choice}
	g, trigger, err := s.model.ToolGrammar(o)
	if err != nil {
		return nil, err
	}
	return &tooling{chat: o, format: s.model.ToolFormat(), grammar: g, trigger: trigger}, nil
}

// constrain puts the tools' grammar in o beside format, a response format's (nil: none): a
// lazy one gives way to it (a call is then the model's to write right), one that holds the
// whole answer cannot share it.
func (t *tooling) constrain(o *engine.GenerateOptions, format *grammar.Grammar) error {
	o.Grammar = format
	if t == nil || t.grammar == nil || format != nil && t.trigger != "" {
		return nil
	}
	if format != nil {
		return fmt.Errorf("a response format and a tool_choice that requires a call (or tools on a model whose template knows none): give one")
	}
	o.Grammar, o.GrammarTrigger = t.grammar, t.trigger
	return nil
}

// chatOptions are what the template renders with: the tools, or none.
func (t *tooling) chatOptions() engine.ChatOptions {
	if t == nil {
		return engine.ChatOptions{}
	}
	return t.chat
}

// parser starts reading an answer for calls (nil without tools).
func (t *tooling) parser() *toolcall.Parser {
	if t == nil {
		return nil
	}
	return toolcall.NewParser(t.format)
}

// openaiTools reads OpenAI's tools, tool_choice and parallel_tool_calls.
func openaiTools(q *chatRequest) ([]engine.Tool, engine.ToolChoice, *reqError) {
	choice := engine.ToolChoice{Parallel: q.ParallelToolCalls == nil || *q.ParallelToolCalls}
	if present(q.Functions) || present(q.FunctionCall) {
		return nil, choice, invalid("functions", "functions and function_call are OpenAI's deprecated form of tools: send tools and tool_choice")
	}
	var tools []engine.Tool
	if present(q.Tools) {
		var in []struct {
			Type     string `json:"type"`
			Function *struct {
				Name        string          `json:"name"`
				Description string          `json:"description"`
				Parameters  json.RawMessage `json:"parameters"`
			} `json:"function"`
		}
		if err := json.Unmarshal(q.Tools, &in); err != nil {
			return nil, choice, invalid("tools", "tools: want an array of {\"type\": \"function\", \"function\": {...}}: %v", err)
		}
		for i, t := range in {
			if t.Type != "function" || t.Function == nil {
				return nil, choice, invalid(fmt.Sprintf("tools[%d]", i), "tools[%d]: type %q: only function tools, with their function object, are supported", i, t.Type)
			}
			params := t.Function.Parameters
			if !present(params) {
				params = nil
			}
			tools = append(tools, engine.Tool{Name: t.Function.Name, Description: t.Function.Description, Parameters: params})
		}
	}
	if err := toolChoice(q.ToolChoice, &choice); err != nil {
		return nil, choice, err
	}
	if choice.Mode != toolcall.Auto && choice.Mode != toolcall.None && len(tools) == 0 {
		return nil, choice, invalid("tool_choice", "tool_choice requires a call, and there are no tools")
	}
	return tools, choice, nil
}

// toolChoice reads tool_choice: "none", "auto", "required", or a named function.
func toolChoice(raw json.RawMessage, c *engine.ToolChoice) *reqError {
	if !present(raw) {
		return nil
	}
	var mode string
	if json.Unmarshal(raw, &mode) == nil {
		switch mode {
		case "auto":
			c.Mode = toolcall.Auto
		case "none":
			c.Mode = toolcall.None
		case "required":
			c.Mode = toolcall.Required
		default:
			return invalid("tool_choice", "tool_choice %q: want none, auto, required or {\"type\": \"function\", \"function\": {\"name\": ...}}", mode)
		}
		return nil
	}
	var named struct {
		Type     string `json:"type"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if err := json.Unmarshal(raw, &named); err != nil || named.Type != "function" || named.Function.Name == "" {
		return invalid("tool_choice", "tool_choice: want none, auto, required or {\"type\": \"function\", \"function\": {\"name\": ...}}")
	}
	c.Mode, c.Name = toolcall.Named, named.Function.Name
	return nil
}

// openaiCalls is an answer's calls as OpenAI writes them in a message.
func openaiCalls(calls []toolcall.Call) []map[string]any {
	out := make([]map[string]any, len(calls))
	for i, c := range calls {
		out[i] = map[string]any{"id": c.ID, "type": "function", "function": map[string]any{"name": c.Name, "arguments": c.Arguments}}
	}
	return out
}

// openaiCallDeltas are the news of calls in a stream's delta: a call's index, id, type and
// name the first time, then pieces of its arguments.
func openaiCallDeltas(ds []toolcall.CallDelta) []map[string]any {
	out := make([]map[string]any, len(ds))
	for i, d := range ds {
		fn := map[string]any{"arguments": d.Args}
		c := map[string]any{"index": d.Index, "function": fn}
		if d.Name != "" {
			c["id"], c["type"], fn["name"] = d.ID, "function", d.Name
		}
		out[i] = c
	}
	return out
}

// ollamaTools reads ollama's tools, which are OpenAI's function tools; ollama has no
// tool_choice: the model may call any, several at once.
func ollamaTools(in api.Tools) ([]engine.Tool, error) {
	tools := make([]engine.Tool, 0, len(in))
	for i, t := range in {
		if t.Type != "" && t.Type != "function" {
			return nil, fmt.Errorf("tools[%d]: type %q: only function tools are supported", i, t.Type)
		}
		params, err := json.Marshal(t.Function.Parameters)
		if err != nil {
			return nil, fmt.Errorf("tools[%d] (%s): parameters: %v", i, t.Function.Name, err)
		}
		if bytes.Equal(params, []byte(`{"type":"","properties":null}`)) {
			params = nil
		}
		tools = append(tools, engine.Tool{Name: t.Function.Name, Description: t.Function.Description, Parameters: params})
	}
	return tools, nil
}

// ollamaCalls is an answer's calls as ollama writes them: arguments as an object.
func ollamaCalls(calls []toolcall.Call) []api.ToolCall {
	out := make([]api.ToolCall, 0, len(calls))
	for i, c := range calls {
		args := api.NewToolCallFunctionArguments()
		if err := json.Unmarshal([]byte(c.Arguments), &args); err != nil {
			continue // ollama's arguments are an object: a call whose arguments are not one is left out
		}
		out = append(out, api.ToolCall{ID: c.ID, Function: api.ToolCallFunction{Index: i, Name: c.Name, Arguments: args}})
	}
	return out
}

// ollamaMessageCalls reads an assistant message's calls from ollama's shape.
func ollamaMessageCalls(in []api.ToolCall) ([]engine.ToolCall, error) {
	out := make([]engine.ToolCall, len(in))
	for i, c := range in {
		args, err := json.Marshal(c.Function.Arguments)
		if err != nil {
			return nil, err
		}
		if string(args) == "null" {
			args = []byte("{}")
		}
		out[i] = engine.ToolCall{ID: c.ID, Name: c.Function.Name, Arguments: string(args)}
	}
	return out, nil
}
