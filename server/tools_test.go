package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ollama/ollama/api"
	"github.com/openai/openai-go/v3"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/grammar"
	"github.com/commit-run/commit-run/server"
	"github.com/commit-run/commit-run/synth"
)

const weatherParams = `{"type": "object", "properties": {"city": {"type": "string", "maxLength": 12, "description": "A city"},
	"unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}, "days": {"type": "integer", "minimum": 1}},
	"required": ["city"], "additionalProperties": false}`

const addParams = `{"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}`

// toolModel writes a synthetic Qwen3-MoE with Qwen3's real chat template and its
// <tool_call> and </tool_call> tokens (user-defined, as in Qwen's vocabulary), and opens it.
func toolModel(t *testing.T) *engine.Model { return templateModel(t, "qwen3") }

// templateModel is toolModel with another of tokenizer's real chat templates.
func templateModel(t *testing.T, template string) *engine.Model {
	t.Helper()
	spec, err := synth.GoldenSpec("qwen3moe-f32")
	if err != nil {
		t.Fatal(err)
	}
	sm, err := synth.Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := os.ReadFile(filepath.Join("..", "tokenizer", "testdata", "chat", template+".jinja"))
	if err != nil {
		t.Fatal(err)
	}
	sm.KV["tokenizer.chat_template"] = string(tmpl)
	tokens := sm.KV["tokenizer.ggml.tokens"].([]string)
	types := sm.KV["tokenizer.ggml.token_type"].([]int32)
	// The synthetic vocabulary's user-defined <think> and </think> become them: this test
	// does not think.
	renamed := 0
	for i, tok := range tokens {
		if name, ok := map[string]string{"<think>": "<tool_call>", "</think>": "</tool_call>"}[tok]; ok && types[i] == 4 {
			tokens[i] = name
			renamed++
		}
	}
	if renamed != 2 {
		t.Fatalf("%d of <think> and </think> found as user-defined tokens", renamed)
	}
	path := filepath.Join(t.TempDir(), "qwen3-tools.gguf")
	if _, err := sm.Write(path); err != nil {
		t.Fatal(err)
	}
	m, err := engine.Open(path, engine.Options{Threads: 2, KVType: "f32", ContextLength: 2048})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// startTools serves the bundled model with a context long enough for tools described in
// its system message (beyond the 256 positions it was trained on, as llama.cpp allows).
func startTools(t *testing.T) string {
	m, err := engine.Open(bundled, engine.Options{Threads: 2, ContextLength: 1024})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return serve(t, m, server.Options{})
}

func schemaOf(t *testing.T, s string) map[string]any {
	var v map[string]any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatal(err)
	}
	return v
}

func tools(t *testing.T) []openai.ChatCompletionToolUnionParam {
	return []openai.ChatCompletionToolUnionParam{
		openai.ChatCompletionFunctionTool(openai.FunctionDefinitionParam{Name: "get_weather", Description: openai.String("The weather in a city."),
			Parameters: schemaOf(t, weatherParams)}),
		openai.ChatCompletionFunctionTool(openai.FunctionDefinitionParam{Name: "add", Parameters: schemaOf(t, addParams)}),
	}
}

// checkCall: a call names one of the tools, and its arguments are JSON its schema accepts.
func checkCall(t *testing.T, name, args string) {
	t.Helper()
	schema := map[string]string{"get_weather": weatherParams, "add": addParams}[name]
	if schema == "" {
		t.Fatalf("a call to %q, which is not a tool", name)
	}
	g, err := grammar.CompileLoose([]byte(schema))
	if err != nil {
		t.Fatal(err)
	}
	if !json.Valid([]byte(args)) || !g.Match([]byte(args)) {
		t.Fatalf("call %s: arguments %q do not validate", name, args)
	}
}

// TestToolCallsOpenAI: with OpenAI's official SDK, on a model with Qwen3's template, a
// required call (held to the Hermes format by the grammar) comes back as tool_calls whose
// arguments validate, the same whole and streamed (deltas with index, id and pieces of
// the arguments); a named function is the one called; the call and its result go back into
// the template for the next turn; tool_choice none answers without tools.
func TestToolCallsOpenAI(t *testing.T) {
	m := toolModel(t)
	c := client(serve(t, m, server.Options{}), "")
	ctx := context.Background()
	user := openai.UserMessage("What is the weather in Paris?")
	params := openai.ChatCompletionNewParams{Model: "qwen3", Messages: []openai.ChatCompletionMessageParamUnion{user},
		Tools: tools(t), MaxTokens: openai.Int(160), Temperature: openai.Float(1), Seed: openai.Int(3),
		ToolChoice: openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("required")}}
	whole, err := c.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	msg := whole.Choices[0].Message
	if whole.Choices[0].FinishReason != "tool_calls" || len(msg.ToolCalls) == 0 || msg.Content != "" {
		t.Fatalf("required: finish %q, %d calls, content %q", whole.Choices[0].FinishReason, len(msg.ToolCalls), msg.Content)
	}
	for _, call := range msg.ToolCalls {
		if !strings.HasPrefix(call.ID, "call_") || call.Type != "function" {
			t.Errorf("call %+v: want an id call_... and type function", call)
		}
		checkCall(t, call.Function.Name, call.Function.Arguments)
	}
	t.Logf("required: %d calls, the first %s(%s)", len(msg.ToolCalls), msg.ToolCalls[0].Function.Name, msg.ToolCalls[0].Function.Arguments)

	stream := c.Chat.Completions.NewStreaming(ctx, params)
	var acc openai.ChatCompletionAccumulator
	argChunks := 0
	for stream.Next() {
		ch := stream.Current()
		acc.AddChunk(ch)
		for _, tc := range ch.Choices[0].Delta.ToolCalls {
			if tc.Function.Arguments != "" {
				argChunks++
			}
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	got := acc.Choices[0]
	if got.FinishReason != "tool_calls" || len(got.Message.ToolCalls) != len(msg.ToolCalls) || argChunks < 2 {
		t.Fatalf("streamed: finish %q, %d calls in %d argument pieces; want %d calls", got.FinishReason, len(got.Message.ToolCalls), argChunks, len(msg.ToolCalls))
	}
	for i, call := range got.Message.ToolCalls {
		if call.Function.Name != msg.ToolCalls[i].Function.Name || call.Function.Arguments != msg.ToolCalls[i].Function.Arguments || call.ID == "" {
			t.Errorf("streamed call %d %+v, whole %+v", i, call.Function, msg.ToolCalls[i].Function)
		}
	}

	named := params
	named.ToolChoice = openai.ChatCompletionToolChoiceOptionUnionParam{OfFunctionToolChoice: &openai.ChatCompletionNamedToolChoiceParam{
		Function: openai.ChatCompletionNamedToolChoiceFunctionParam{Name: "add"}}}
	named.ParallelToolCalls = openai.Bool(false)
	r, err := c.Chat.Completions.New(ctx, named)
	if err != nil {
		t.Fatal(err)
	}
	if calls := r.Choices[0].Message.ToolCalls; len(calls) != 1 || calls[0].Function.Name != "add" {
		t.Fatalf("named add, one call: %+v", calls)
	} else {
		checkCall(t, "add", calls[0].Function.Arguments)
	}

	// The round trip: the assistant's calls and a tool's result, back into Qwen3's template.
	call := msg.ToolCalls[0]
	next := params
	next.ToolChoice = openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("auto")}
	next.MaxTokens = openai.Int(8)
	next.Messages = append(next.Messages, msg.ToParam(), openai.ToolMessage(`{"temp": 21}`, call.ID))
	r, err = c.Chat.Completions.New(ctx, next)
	if err != nil {
		t.Fatal(err)
	}
	if r.Choices[0].FinishReason == "" {
		t.Errorf("round trip: %+v", r.Choices[0])
	}
	ids, err := m.ChatTokensWith([]engine.Message{{Role: "user", Content: "What is the weather in Paris?"},
		{Role: "assistant", ToolCalls: []engine.ToolCall{{ID: call.ID, Name: call.Function.Name, Arguments: call.Function.Arguments}}},
		{Role: "tool", Content: `{"temp": 21}`, ToolCallID: call.ID}}, engine.ChatOptions{Tools: []engine.Tool{{Name: "add", Parameters: json.RawMessage(addParams)}}})
	if err != nil {
		t.Fatal(err)
	}
	prompt := m.Detokenize(ids)
	for _, want := range []string{"<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"add\", \"parameters\": {\"type\": \"object\"",
		"<tool_call>\n{\"name\": \"" + call.Function.Name + "\", \"arguments\": ", "<tool_response>\n{\"temp\": 21}\n</tool_response>"} {
		if !strings.Contains(prompt, want) {
			t.Errorf("the next turn's prompt lacks %q:\n%s", want, prompt)
		}
	}

	// auto: the model is free until it writes <tool_call>, and held to the format from there
	// (a lazy grammar), so whatever call it starts parses.
	for seed := range 4 {
		auto := params
		auto.ToolChoice = openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("auto")}
		auto.Seed, auto.MaxTokens = openai.Int(int64(seed)), openai.Int(24)
		r, err := c.Chat.Completions.New(ctx, auto)
		if err != nil {
			t.Fatal(err)
		}
		if ch := r.Choices[0]; ch.FinishReason != "length" {
			for _, call := range ch.Message.ToolCalls {
				checkCall(t, call.Function.Name, call.Function.Arguments)
			}
		}
	}

	none := params
	none.ToolChoice = openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("none")}
	none.MaxTokens = openai.Int(6)
	if r, err := c.Chat.Completions.New(ctx, none); err != nil || len(r.Choices[0].Message.ToolCalls) != 0 {
		t.Errorf("tool_choice none: %v %+v", err, r)
	}
}

// TestToolCallsAuto: on the bundled model, whose template knows no tools, the tools go into
// the system message and the answer is held to the generic JSON format: on every seed it is
// either calls whose arguments validate or a text answer, whole and streamed alike.
func TestToolCallsAuto(t *testing.T) {
	addr := startTools(t)
	c := client(addr, "")
	ctx := context.Background()
	calls := 0
	for seed := range 8 {
		params := openai.ChatCompletionNewParams{Model: "m", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Weather?")},
			Tools: tools(t), MaxTokens: openai.Int(400), Temperature: openai.Float(1), Seed: openai.Int(int64(seed)),
			ParallelToolCalls: openai.Bool(false)} // a random model would go on calling to the token limit
		r, err := c.Chat.Completions.New(ctx, params)
		if err != nil {
			t.Fatal(err)
		}
		ch := r.Choices[0]
		t.Logf("seed %d: %s, %d calls, %d tokens: %.80q", seed, ch.FinishReason, len(ch.Message.ToolCalls), r.Usage.CompletionTokens, ch.Message.Content)
		if ch.FinishReason == "length" {
			continue // a random model's whitespace ran out the tokens: the call is cut short
		}
		for _, call := range ch.Message.ToolCalls {
			checkCall(t, call.Function.Name, call.Function.Arguments)
		}
		if len(ch.Message.ToolCalls) > 0 {
			calls++
			if ch.FinishReason != "tool_calls" {
				t.Errorf("seed %d: calls with finish %q", seed, ch.FinishReason)
			}
		} else if ch.FinishReason == "stop" && (ch.Message.Content == "" || strings.HasPrefix(ch.Message.Content, `{"`)) {
			t.Errorf("seed %d: neither calls nor an answer: %q", seed, ch.Message.Content)
		}
		stream := c.Chat.Completions.NewStreaming(ctx, params)
		var acc openai.ChatCompletionAccumulator
		for stream.Next() {
			acc.AddChunk(stream.Current())
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if a := acc.Choices[0]; a.Message.Content != ch.Message.Content || len(a.Message.ToolCalls) != len(ch.Message.ToolCalls) {
			t.Errorf("seed %d: streamed %q with %d calls, whole %q with %d", seed, a.Message.Content, len(a.Message.ToolCalls), ch.Message.Content, len(ch.Message.ToolCalls))
		}
	}
	if calls == 0 {
		t.Error("no seed made a call")
	}
}

// TestToolCallsOllama: with ollama's Go client, tools on /api/chat come back as
// message.tool_calls with arguments as an object, streamed and whole alike, and a tool
// message goes back into the chat.
func TestToolCallsOllama(t *testing.T) {
	addr := startTools(t)
	base, _ := url.Parse(addr)
	c := api.NewClient(base, http.DefaultClient)
	ctx := context.Background()
	var tools api.Tools
	if err := json.Unmarshal([]byte(`[{"type": "function", "function": {"name": "get_weather", "description": "The weather.", "parameters": `+weatherParams+`}}]`), &tools); err != nil {
		t.Fatal(err)
	}
	var found []api.ToolCall
	for seed := 0; seed < 8 && len(found) == 0; seed++ {
		results := map[bool][]api.ToolCall{}
		seen := map[bool]string{}
		for _, stream := range []bool{false, true} {
			err := c.Chat(ctx, &api.ChatRequest{Model: "m", Messages: []api.Message{{Role: "user", Content: "Weather in Rome?"}}, Tools: tools, Stream: &stream,
				Options: map[string]any{"seed": seed, "temperature": 1, "num_predict": 400}}, func(r api.ChatResponse) error {
				results[stream] = append(results[stream], r.Message.ToolCalls...)
				for _, tc := range r.Message.ToolCalls {
					args, _ := json.Marshal(tc.Function.Arguments)
					seen[stream] += fmt.Sprintf("%d %s %s;", tc.Function.Index, tc.Function.Name, args)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		if seen[false] != seen[true] {
			t.Fatalf("seed %d: whole %s, streamed %s", seed, seen[false], seen[true])
		}
		found = results[false]
	}
	if len(found) == 0 {
		t.Fatal("no seed made a call")
	}
	args, _ := json.Marshal(found[0].Function.Arguments)
	checkCall(t, found[0].Function.Name, string(args))
	stream := false
	err := c.Chat(ctx, &api.ChatRequest{Model: "m", Tools: tools, Stream: &stream, Options: map[string]any{"num_predict": 4},
		Messages: []api.Message{{Role: "user", Content: "Weather in Rome?"}, {Role: "assistant", ToolCalls: found},
			{Role: "tool", ToolName: "get_weather", Content: "sunny"}}}, func(api.ChatResponse) error { return nil })
	if err != nil {
		t.Errorf("a tool message back: %v", err)
	}
}

// TestToolErrors: malformed tools and choices are 400s that name the field.
func TestToolErrors(t *testing.T) {
	addr, _ := startStructured(t)
	user := `"messages": [{"role": "user", "content": "x"}]`
	tool := `{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}`
	for _, c := range []struct{ body, param string }{
		{`{` + user + `, "tools": [{"type": "web_search"}]}`, "tools[0]"},
		{`{` + user + `, "tools": {"a": 1}}`, "tools"},
		{`{` + user + `, "tools": [{"type": "function", "function": {"name": "a b"}}]}`, "tools"},
		{`{` + user + `, "tools": [` + tool + `, ` + tool + `]}`, "tools"},
		{`{` + user + `, "tools": [` + tool + `], "tool_choice": "sometimes"}`, "tool_choice"},
		{`{` + user + `, "tools": [` + tool + `], "tool_choice": {"type": "function", "function": {"name": "g"}}}`, "tool_choice"},
		{`{` + user + `, "tool_choice": "required"}`, "tool_choice"},
		{`{` + user + `, "tools": [` + tool + `], "tool_choice": "required", "response_format": {"type": "json_object"}}`, "response_format"},
		{`{` + user + `, "functions": [{"name": "f"}]}`, "functions"},
		{`{"messages": [{"role": "tool", "content": "x"}]}`, "messages[0].tool_call_id"},
		{`{"messages": [{"role": "function", "content": "x"}]}`, "messages[0].role"},
		{`{"messages": [{"role": "user", "content": "x", "tool_calls": [{"id": "1", "function": {"name": "f"}}]}]}`, "messages[0].tool_calls"},
		{`{"messages": [{"role": "assistant", "content": "x", "tool_calls": [{"function": {"name": "f"}}]}]}`, "messages[0].tool_calls[0]"},
	} {
		r := post(t, addr+"/v1/chat/completions", "", c.body)
		if r.status != http.StatusBadRequest || !strings.Contains(r.body, `"param":"`+c.param+`"`) {
			t.Errorf("%s: %d %s, want 400 naming %s", c.body, r.status, r.body, c.param)
		}
	}
}

// harmonyModel writes a synthetic gpt-oss with gpt-oss's chat template and harmony's
// control tokens (some of its unused tokens renamed), and opens it.
func harmonyModel(t *testing.T) *engine.Model {
	t.Helper()
	spec, err := synth.GoldenSpec("gpt-oss-f32")
	if err != nil {
		t.Fatal(err)
	}
	harmony := []string{"<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>", "<|constrain|>"}
	var sm *synth.Model
	for extra := 0; ; extra += 64 {
		spec.Vocab += extra
		if sm, err = synth.Build(spec); err != nil {
			t.Fatal(err)
		}
		unused := 0
		for _, tok := range sm.KV["tokenizer.ggml.tokens"].([]string) {
			if strings.HasPrefix(tok, "<unused") {
				unused++
			}
		}
		if unused >= len(harmony) {
			break
		}
	}
	tokens := sm.KV["tokenizer.ggml.tokens"].([]string)
	types := sm.KV["tokenizer.ggml.token_type"].([]int32)
	for i, k := 0, 0; i < len(tokens) && k < len(harmony); i++ {
		if strings.HasPrefix(tokens[i], "<unused") {
			tokens[i], types[i] = harmony[k], 3 // control
			k++
		}
	}
	tmpl, err := os.ReadFile(filepath.Join("..", "tokenizer", "testdata", "chat", "gptoss.jinja"))
	if err != nil {
		t.Fatal(err)
	}
	sm.KV["tokenizer.chat_template"] = string(tmpl)
	path := filepath.Join(t.TempDir(), "gpt-oss-harmony.gguf")
	if _, err := sm.Write(path); err != nil {
		t.Fatal(err)
	}
	m, err := engine.Open(path, engine.Options{Threads: 2, KVType: "f32", ContextLength: 1024})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// TestToolCallsHarmony: on a gpt-oss model (its template, rendered by the built-in harmony
// format), a required call is written on the commentary channel to functions.f, held there
// by the grammar with harmony's markers as their own tokens, and comes back as tool_calls
// with no markup in the content.
func TestToolCallsHarmony(t *testing.T) {
	m := harmonyModel(t)
	if f := m.ToolFormat(); f.Name() != "harmony" {
		t.Fatalf("format %s, want harmony", f.Name())
	}
	c := client(serve(t, m, server.Options{}), "")
	params := openai.ChatCompletionNewParams{Model: "gpt-oss", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Add 1 and 2.")},
		Tools: tools(t), MaxTokens: openai.Int(200), Temperature: openai.Float(1), Seed: openai.Int(5),
		ToolChoice: openai.ChatCompletionToolChoiceOptionUnionParam{OfFunctionToolChoice: &openai.ChatCompletionNamedToolChoiceParam{
			Function: openai.ChatCompletionNamedToolChoiceFunctionParam{Name: "add"}}}}
	r, err := c.Chat.Completions.New(context.Background(), params)
	if err != nil {
		t.Fatal(err)
	}
	msg := r.Choices[0].Message
	if len(msg.ToolCalls) != 1 || msg.ToolCalls[0].Function.Name != "add" || strings.Contains(msg.Content, "<|") || r.Choices[0].FinishReason != "tool_calls" {
		t.Fatalf("harmony call: %+v, finish %s", msg, r.Choices[0].FinishReason)
	}
	checkCall(t, "add", msg.ToolCalls[0].Function.Arguments)
}

// TestToolCallsQwen35: with Qwen3.5's real template (Qwen3-Coder's XML calls), a named
// call is held to the XML format, each parameter a declared one, at most once, an enum's
// value one of it, others bounded by their schema (get_weather's city of 12 characters and
// integer days, so that the random model ends within the tokens), and its values come back
// as JSON arguments.
func TestToolCallsQwen35(t *testing.T) {
	m := templateModel(t, "qwen35")
	if f := m.ToolFormat(); f.Name() != "qwen3coder" {
		t.Fatalf("format %s, want qwen3coder", f.Name())
	}
	c := client(serve(t, m, server.Options{}), "")
	params := openai.ChatCompletionNewParams{Model: "qwen3.5", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Weather in Paris?")},
		Tools: tools(t), MaxTokens: openai.Int(600), Temperature: openai.Float(1), Seed: openai.Int(2), ParallelToolCalls: openai.Bool(false),
		ToolChoice: openai.ChatCompletionToolChoiceOptionUnionParam{OfFunctionToolChoice: &openai.ChatCompletionNamedToolChoiceParam{
			Function: openai.ChatCompletionNamedToolChoiceFunctionParam{Name: "get_weather"}}}}
	r, err := c.Chat.Completions.New(context.Background(), params)
	if err != nil {
		t.Fatal(err)
	}
	ch := r.Choices[0]
	if len(ch.Message.ToolCalls) != 1 || ch.FinishReason != "tool_calls" {
		t.Fatalf("required on Qwen3.5's format: %+v, finish %s", ch.Message, ch.FinishReason)
	}
	call := ch.Message.ToolCalls[0]
	var args map[string]any
	if err := json.Unmarshal([]byte(call.Function.Arguments), &args); err != nil {
		t.Fatalf("arguments %q: %v", call.Function.Arguments, err)
	}
	declared := map[string]map[string]bool{"get_weather": {"city": true, "unit": true, "days": true}, "add": {"a": true, "b": true}}[call.Function.Name]
	for k := range args {
		if !declared[k] {
			t.Errorf("call %s: parameter %q is not declared", call.Function.Name, k)
		}
	}
	if u, ok := args["unit"]; ok && u != "celsius" && u != "fahrenheit" {
		t.Errorf("unit %q: not one of its enum", u)
	}
	t.Logf("%s(%s)", call.Function.Name, call.Function.Arguments)
}

// TestChatTemplateKwargs: llama-server's chat_template_kwargs reach the template (Qwen3's
// enable_thinking false writes an empty thinking block into the prompt), and the template's
// own variables cannot be set through them.
func TestChatTemplateKwargs(t *testing.T) {
	m := toolModel(t)
	addr := serve(t, m, server.Options{})
	promptTokens := func(kwargs string) (int, response) {
		r := post(t, addr+"/v1/chat/completions", "", `{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1`+kwargs+`}`)
		var v struct {
			Usage struct {
				PromptTokens int `json:"prompt_tokens"`
			} `json:"usage"`
		}
		json.Unmarshal([]byte(r.body), &v)
		return v.Usage.PromptTokens, r
	}
	plain, _ := promptTokens("")
	think, r := promptTokens(`, "chat_template_kwargs": {"enable_thinking": false}`)
	ids, err := m.ChatTokensWith([]engine.Message{{Role: "user", Content: "Hi"}}, engine.ChatOptions{Vars: map[string]json.RawMessage{"enable_thinking": json.RawMessage("false")}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(m.Detokenize(ids), "<|im_start|>assistant\n<think>\n\n</think>\n\n") || think != len(ids) || think <= plain {
		t.Errorf("enable_thinking false: %d prompt tokens (%s), %d without; the engine's prompt %q", think, r.body, plain, m.Detokenize(ids))
	}
	if _, r := promptTokens(`, "chat_template_kwargs": {"messages": []}`); r.status != http.StatusBadRequest || !strings.Contains(r.body, "chat_template_kwargs") {
		t.Errorf("messages through chat_template_kwargs: %d %s", r.status, r.body)
	}
}
