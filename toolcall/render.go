package toolcall

import (
	"encoding/json"

	"github.com/commit-run/commit-run/grammar"
	"github.com/commit-run/commit-run/tokenizer"
)

// Constraint is the grammar an answer with tools is generated under, and its trigger (the
// text from which it holds, "" from the first token): the format's calls where the choice
// requires one; calls or a response as JSON where the format is the generic one; and where
// the model may answer or call, the calls from their marker on, for formats that have one
// (Triggered); else nil: the model answers freely.
func Constraint(f Format, tools []Tool, choice Choice) (g *grammar.Grammar, trigger string, err error) {
	tools, err = Select(tools, choice)
	if err != nil || len(tools) == 0 {
		return nil, "", err
	}
	switch t, triggered := f.(Triggered); {
	case choice.Mode == Required || choice.Mode == Named:
		g, err = f.Grammar(tools, choice.Parallel)
	case !Native(f):
		g, err = AnswerGrammar(tools, choice.Parallel)
	case triggered:
		g, err = f.Grammar(tools, choice.Parallel)
		trigger = t.Trigger()
	}
	return g, trigger, err
}

// Render renders a chat with tools through tok's template, writing for it what it cannot
// take: tools it does not write go into the system message (SystemPrompt, in the model's
// format), and where it writes no tool calls, a turn's calls become the text the model
// writes for them (Format.Write) and tool results become user turns. vars are further
// template variables, as JSON values.
func Render(tok *tokenizer.Tokenizer, msgs []tokenizer.Message, tools []Tool, choice Choice, vars map[string]json.RawMessage) (tokenizer.ChatPrompt, error) {
	tools, err := Select(tools, choice)
	if err != nil {
		return tokenizer.ChatPrompt{}, err
	}
	if err := Validate(tools); err != nil {
		return tokenizer.ChatPrompt{}, err
	}
	caps := tok.ChatCaps()
	f := Detect(tok.ChatTemplate())
	out := make([]tokenizer.Message, 0, len(msgs)+1)
	if len(tools) > 0 && !caps.Tools {
		prompt := SystemPrompt(f, tools, choice)
		if len(msgs) > 0 && msgs[0].Role == "system" {
			prompt = msgs[0].Content + "\n\n" + prompt
			msgs = msgs[1:]
		}
		out = append(out, tokenizer.Message{Role: "system", Content: prompt})
	}
	for _, m := range msgs {
		out = append(out, templateMessage(m, caps, f))
	}
	o := tokenizer.ChatOptions{AddGenerationPrompt: true, Vars: vars}
	if caps.Tools {
		o.Tools = OpenAITools(tools)
	}
	return tok.RenderChatWith(out, o)
}

// templateMessage is m as a template with caps can take it.
func templateMessage(m tokenizer.Message, caps tokenizer.ChatCaps, f Format) tokenizer.Message {
	switch {
	case caps.ToolCalls:
	case len(m.ToolCalls) > 0:
		calls := make([]Call, len(m.ToolCalls))
		for i, c := range m.ToolCalls {
			calls[i] = Call{ID: c.ID, Name: c.Name, Arguments: c.Arguments}
		}
		if m.Content != "" {
			m.Content += "\n\n"
		}
		m.Content += f.Write(calls)
		m.ToolCalls = nil
	case m.Role == "tool":
		result := map[string]string{"tool_call_id": m.ToolCallID, "name": m.Name, "content": m.Content}
		b, _ := json.Marshal(map[string]any{"tool_response": result}) // strings always encode
		m = tokenizer.Message{Role: "user", Content: string(b)}
	}
	return m
}
