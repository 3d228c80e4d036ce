package engine

import (
	"encoding/json"
	"fmt"

	"github.com/commit-run/commit-run/grammar"
	"github.com/commit-run/commit-run/tokenizer"
	"github.com/commit-run/commit-run/toolcall"
)

// Tool calling: the tools go to the model's chat template (or, where it knows none, into
// the system message, described in the model's call format), the calls come back in that
// format (Model.ToolFormat; read them with toolcall.NewParser), and a request that must
// call holds the model to the format with ToolGrammar.
type (
	// Tool is a function the model may call.
	Tool = toolcall.Tool
	// ToolCall is a call an assistant turn made.
	ToolCall = toolcall.Call
	// ToolChoice is what the model may do with the tools: tool_choice.
	ToolChoice = toolcall.Choice
)

// ChatOptions are what a chat is rendered with besides its messages.
type ChatOptions struct {
	Tools  []Tool
	Choice ToolChoice
	// Vars are further template variables, as JSON values: what llama-server's
	// chat_template_kwargs pass (Qwen3's enable_thinking, gpt-oss's reasoning_effort).
	Vars map[string]json.RawMessage
}

// ToolFormat is the format the model writes tool calls in, by its chat template's markers
// (toolcall.Detect).
func (m *Model) ToolFormat() toolcall.Format { return toolcall.Detect(m.tok.ChatTemplate()) }

// ToolGrammar is the grammar a chat with o's tools generates under, and its trigger
// (GenerateOptions.GrammarTrigger): see toolcall.Constraint.
func (m *Model) ToolGrammar(o ChatOptions) (g *grammar.Grammar, trigger string, err error) {
	return toolcall.Constraint(m.ToolFormat(), o.Tools, o.Choice)
}

// ChatTokensWith is ChatTokens with tools, rendered as toolcall.Render renders them: what
// the template cannot take is written for it.
func (m *Model) ChatTokensWith(msgs []Message, o ChatOptions) ([]int32, error) {
	if len(msgs) == 0 {
		return nil, fmt.Errorf("chat needs at least one message")
	}
	tm := make([]tokenizer.Message, len(msgs))
	for i, msg := range msgs {
		tm[i] = tokenizer.Message{Role: msg.Role, Content: msg.Content, ToolCallID: msg.ToolCallID, Name: msg.Name}
		for _, c := range msg.ToolCalls {
			tm[i].ToolCalls = append(tm[i].ToolCalls, tokenizer.ToolCall{ID: c.ID, Name: c.Name, Arguments: c.Arguments})
		}
	}
	text, err := toolcall.Render(m.tok, tm, o.Tools, o.Choice, o.Vars)
	if err != nil {
		return nil, fmt.Errorf("chat: %w", err)
	}
	// The template may write BOS itself; EncodePrompt adds it only when it did not.
	return m.tok.EncodePrompt(text.Text)
}
