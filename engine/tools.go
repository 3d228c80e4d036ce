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
}

// ToolFormat is the format the model writes tool calls in, by its chat template's markers
// (toolcall.Detect).
func (m *Model) ToolFormat() toolcall.Format { return toolcall.Detect(m.tok.ChatTemplate()) }

// ToolGrammar is the grammar a chat with o's tools generates under, and its trigger
// (GenerateOptions.GrammarTrigger): the format's calls from the first token where the
// choice requires one; calls or a response as JSON where the template knows no tools; and
// where the model may answer or call, the calls from their marker on, for formats that have
// one (toolcall.Triggered), else nil: the model answers freely.
func (m *Model) ToolGrammar(o ChatOptions) (g *grammar.Grammar, trigger string, err error) {
	tools, err := toolcall.Select(o.Tools, o.Choice)
	if err != nil || len(tools) == 0 {
		return nil, "", err
	}
	f := m.ToolFormat()
	switch t, triggered := f.(toolcall.Triggered); {
	case o.Choice.Mode == toolcall.Required || o.Choice.Mode == toolcall.Named:
		g, err = f.Grammar(tools, o.Choice.Parallel)
	case !toolcall.Native(f):
		g, err = toolcall.AnswerGrammar(tools, o.Choice.Parallel)
	case triggered:
		g, err = f.Grammar(tools, o.Choice.Parallel)
		trigger = t.Trigger()
	}
	return g, trigger, err
}

// ChatTokensWith is ChatTokens with tools. What the template cannot take is written for it:
// tools it does not write go into the system message, and where it writes no tool calls, a
// turn's calls become the text the model writes for them and tool results become user
// turns.
func (m *Model) ChatTokensWith(msgs []Message, o ChatOptions) ([]int32, error) {
	if len(msgs) == 0 {
		return nil, fmt.Errorf("chat needs at least one message")
	}
	tools, err := toolcall.Select(o.Tools, o.Choice)
	if err != nil {
		return nil, err
	}
	if err := toolcall.Validate(tools); err != nil {
		return nil, err
	}
	caps := m.tok.ChatCaps()
	f := m.ToolFormat()
	tm := make([]tokenizer.Message, 0, len(msgs)+1)
	if len(tools) > 0 && !caps.Tools {
		prompt := toolcall.SystemPrompt(f, tools, o.Choice)
		if msgs[0].Role == "system" {
			prompt = msgs[0].Content + "\n\n" + prompt
			msgs = msgs[1:]
		}
		tm = append(tm, tokenizer.Message{Role: "system", Content: prompt})
	}
	for _, msg := range msgs {
		tm = append(tm, templateMessage(msg, caps, f))
	}
	co := tokenizer.ChatOptions{AddGenerationPrompt: true}
	if caps.Tools {
		co.Tools = toolcall.OpenAITools(tools)
	}
	text, err := m.tok.RenderChatWith(tm, co)
	if err != nil {
		return nil, fmt.Errorf("chat template: %w", err)
	}
	// The template may write BOS itself; EncodePrompt adds it only when it did not.
	return m.tok.EncodePrompt(text.Text)
}

// templateMessage is msg as the template can take it.
func templateMessage(msg Message, caps tokenizer.ChatCaps, f toolcall.Format) tokenizer.Message {
	t := tokenizer.Message{Role: msg.Role, Content: msg.Content, ToolCallID: msg.ToolCallID, Name: msg.Name}
	switch {
	case caps.ToolCalls:
		for _, c := range msg.ToolCalls {
			t.ToolCalls = append(t.ToolCalls, tokenizer.ToolCall{ID: c.ID, Name: c.Name, Arguments: c.Arguments})
		}
	case len(msg.ToolCalls) > 0:
		if t.Content != "" {
			t.Content += "\n\n"
		}
		t.Content += f.Write(msg.ToolCalls)
	case msg.Role == "tool":
		result := map[string]string{"tool_call_id": msg.ToolCallID, "name": msg.Name, "content": msg.Content}
		b, _ := json.Marshal(map[string]any{"tool_response": result}) // strings always encode
		t = tokenizer.Message{Role: "user", Content: string(b)}
	}
	return t
}
