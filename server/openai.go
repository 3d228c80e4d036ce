package server

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"reflect"
	"slices"
	"time"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/grammar"
	"github.com/commit-run/commit-run/toolcall"
)

// sampling are the generation fields the OpenAI chat and completions requests share. Fields
// a request may send that the server cannot honour yet are read too, so that a request using
// them gets a clear 400 instead of an answer that silently ignored them.
type sampling struct {
	Model               string          `json:"model"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Temperature         *float64        `json:"temperature"`
	TopP                *float64        `json:"top_p"`
	Stop                json.RawMessage `json:"stop"`
	Seed                *int64          `json:"seed"`
	Stream              bool            `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	N                *int            `json:"n"`
	PresencePenalty  *float64        `json:"presence_penalty"`
	FrequencyPenalty *float64        `json:"frequency_penalty"`
	Logprobs         json.RawMessage `json:"logprobs"`
	TopLogprobs      *int            `json:"top_logprobs"`
	ResponseFormat   json.RawMessage `json:"response_format"`
	// JSONSchema and Grammar are llama-server's own constraints: a schema (as response_format's
	// json_schema) and a GBNF grammar, which this server refuses rather than ignores.
	JSONSchema json.RawMessage `json:"json_schema"`
	Grammar    *string         `json:"grammar"`
	LogitBias  json.RawMessage `json:"logit_bias"`
	Echo       bool            `json:"echo"`
	Suffix     *string         `json:"suffix"`
	BestOf     *int            `json:"best_of"`
	// IgnoreEOS generates to the token limit past the end of text: llama-server's and
	// vLLM's extension, which load benchmarks send for answers of a fixed length.
	IgnoreEOS bool `json:"ignore_eos"`

	// tools is a chat's tools as checked (chatCompletions), nil without.
	tools *tooling
}

type chatRequest struct {
	sampling
	Messages          []chatMessage   `json:"messages"`
	Tools             json.RawMessage `json:"tools"`
	ToolChoice        json.RawMessage `json:"tool_choice"`
	ParallelToolCalls *bool           `json:"parallel_tool_calls"`
	Functions         json.RawMessage `json:"functions"`
	FunctionCall      json.RawMessage `json:"function_call"`
	// ChatTemplateKwargs are llama-server's extra template variables (Qwen3's
	// enable_thinking, gpt-oss's reasoning_effort).
	ChatTemplateKwargs map[string]json.RawMessage `json:"chat_template_kwargs"`
}

type chatMessage struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content"`
	ToolCallID string          `json:"tool_call_id"`
	Name       string          `json:"name"`
	ToolCalls  []struct {
		ID       string `json:"id"`
		Type     string `json:"type"`
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	} `json:"tool_calls"`
}

type completionRequest struct {
	sampling
	Prompt json.RawMessage `json:"prompt"`
}

// reqError is a request the server refuses: its status, OpenAI error type, parameter and
// message.
type reqError struct {
	status     int
	typ, param string
	msg, code  string
}

func invalid(param, format string, a ...any) *reqError {
	return &reqError{status: http.StatusBadRequest, typ: "invalid_request_error", param: param, msg: fmt.Sprintf(format, a...)}
}

func (e *reqError) write(w http.ResponseWriter) {
	var body apiError
	body.Error.Message, body.Error.Type = e.msg, e.typ
	if e.param != "" {
		body.Error.Param = &e.param
	}
	if e.code != "" {
		body.Error.Code = &e.code
	}
	writeJSON(w, e.status, body)
}

// decode reads a JSON request body into v: a body over the cap is 413, malformed JSON or a
// field of the wrong type a 400 that says where.
func decode(r *http.Request, v any) *reqError {
	data, err := io.ReadAll(r.Body)
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return &reqError{status: http.StatusRequestEntityTooLarge, typ: "invalid_request_error",
			msg: fmt.Sprintf("request body over %d bytes", tooBig.Limit)}
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return &reqError{status: http.StatusRequestTimeout, typ: "invalid_request_error",
			msg: fmt.Sprintf("the request body did not arrive in time (%d of its bytes came)", len(data))}
	}
	if err != nil {
		return invalid("", "reading the request body: %v", err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		var te *json.UnmarshalTypeError
		var se *json.SyntaxError
		switch {
		case errors.As(err, &te):
			return invalid(te.Field, "%s: want %s, got JSON %s", te.Field, jsonKind(te.Type), te.Value)
		case errors.As(err, &se):
			return invalid("", "malformed JSON at byte %d: %v", se.Offset, err)
		default:
			return invalid("", "malformed JSON: %v", err)
		}
	}
	return nil
}

// jsonKind names what JSON value a Go type decodes from.
func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Struct, reflect.Map:
		return "an object"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64, reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Pointer:
		return jsonKind(t.Elem())
	}
	return t.String()
}

// options checks the shared fields and turns them into the engine's generation options for a
// prompt of promptLen tokens; a chat's also stop at the strings the model's chats use.
func (s *Server) options(q *sampling, promptLen int, chat bool) (engine.GenerateOptions, *reqError) {
	var o engine.GenerateOptions
	if !s.serves(q.Model) {
		return o, &reqError{status: http.StatusNotFound, typ: "invalid_request_error", param: "model", code: "model_not_found",
			msg: fmt.Sprintf("model %q is not served here; this server serves %q (GET /v1/models)", q.Model, s.name)}
	}
	if err := unsupportedFields(q); err != nil {
		return o, err
	}
	var err *reqError
	if o.MaxTokens, err = s.maxTokens(q, promptLen, chat); err != nil {
		return o, err
	}
	if o.Sampler, err = samplerOptions(q); err != nil {
		return o, err
	}
	o.IgnoreEOS = q.IgnoreEOS
	format, err := responseFormat(q.ResponseFormat)
	if err != nil {
		return o, err
	}
	if cerr := q.tools.constrain(&o, format); cerr != nil {
		return o, invalid("response_format", "response_format: %v", cerr)
	}
	if present(q.JSONSchema) {
		if o.Grammar != nil {
			return o, invalid("json_schema", "json_schema and response_format: give one")
		}
		g, cerr := grammar.Compile(q.JSONSchema)
		if cerr != nil {
			return o, invalid("json_schema", "json_schema: %v", schemaError(cerr))
		}
		o.Grammar = g
	}
	if err := logprobOptions(q, chat, &o); err != nil {
		return o, err
	}
	if q.Seed != nil {
		o.Sampler.Seed = uint64(*q.Seed)
	} else {
		o.Sampler.Seed = uint64(time.Now().UnixNano())
	}
	stops, serr := stopStrings(q.Stop)
	if serr != nil {
		return o, serr
	}
	o.Stop = stops
	if chat && (o.Grammar == nil || o.GrammarTrigger != "") {
		// The model's chat stops are for models that never learnt to end a turn: a grammar
		// ends it, and its strings may be text inside the value.
		o.Stop = append(o.Stop, s.model.Info().ChatStop...)
	}
	return o, nil
}

// unsupportedFields refuses the OpenAI fields this server cannot honour, rather than ignoring
// them: a client that asks for tools or several choices would otherwise get a reply it did not
// ask for and no sign why. Values that mean the default pass.
func unsupportedFields(q *sampling) *reqError {
	unsupported := func(param, what string) *reqError {
		return invalid(param, "%s: %s is not supported by this server", param, what)
	}
	switch {
	case q.N != nil && *q.N != 1:
		return unsupported("n", "more than one choice per request")
	case present(q.LogitBias) && string(q.LogitBias) != "{}":
		return unsupported("logit_bias", "a logit bias")
	case q.Grammar != nil && *q.Grammar != "":
		return unsupported("grammar", "a GBNF grammar (json_schema or response_format constrain the answer to JSON)")
	case q.Echo:
		return unsupported("echo", "echoing the prompt")
	case q.Suffix != nil && *q.Suffix != "":
		return unsupported("suffix", "a suffix")
	case q.BestOf != nil && *q.BestOf != 1:
		return unsupported("best_of", "best_of")
	}
	return nil
}

// maxTokens is the reply's token limit: the room the context leaves after the prompt, or less
// where max_tokens or max_completion_tokens asks. A limit past the room is an error rather than
// cut to fit, so a client learns it cannot have the reply length it counted on.
func (s *Server) maxTokens(q *sampling, promptLen int, chat bool) (int, *reqError) {
	room, err := s.room(promptLen)
	if err != nil {
		param := "prompt"
		if chat {
			param = "messages"
		}
		return 0, &reqError{status: http.StatusBadRequest, typ: "invalid_request_error", param: param, code: "context_length_exceeded", msg: err.Error()}
	}
	ctx := s.model.ContextLength()
	limit := room
	for _, m := range []struct {
		param string
		v     *int
	}{{"max_tokens", q.MaxTokens}, {"max_completion_tokens", q.MaxCompletionTokens}} {
		if m.v == nil {
			continue
		}
		// Beyond the room left it is clamped, as llama-server and ollama clamp it: the answer
		// then ends with finish_reason "length" where the context does.
		if *m.v < 1 {
			return limit, invalid(m.param, "%s %d: want 1 or more (at most %d fit: the context's %d tokens less the prompt's %d)", m.param, *m.v, room, ctx, promptLen)
		}
		limit = min(limit, *m.v)
	}
	return limit, nil
}

// samplerOptions checks the sampling fields against the ranges OpenAI documents, so that a
// request OpenAI would refuse is refused here too, and fills in OpenAI's defaults for absent ones.
func samplerOptions(q *sampling) (engine.SamplerOptions, *reqError) {
	// OpenAI's defaults: temperature 1, top_p 1.
	temp, topP := 1.0, 1.0
	if q.Temperature != nil {
		if temp = *q.Temperature; !(temp >= 0 && temp <= 2) {
			return engine.SamplerOptions{}, invalid("temperature", "temperature %v: want 0 to 2", temp)
		}
	}
	if q.TopP != nil {
		if topP = *q.TopP; !(topP > 0 && topP <= 1) {
			return engine.SamplerOptions{}, invalid("top_p", "top_p %v: want more than 0, at most 1", topP)
		}
	}
	so := engine.SamplerOptions{Temperature: float32(temp), TopP: float32(topP), Greedy: temp == 0}
	for _, p := range []struct {
		param string
		v     *float64
		to    *float32
	}{{"presence_penalty", q.PresencePenalty, &so.PresencePenalty}, {"frequency_penalty", q.FrequencyPenalty, &so.FrequencyPenalty}} {
		if p.v == nil {
			continue
		}
		if !(*p.v >= -2 && *p.v <= 2) {
			return so, invalid(p.param, "%s %v: want -2 to 2", p.param, *p.v)
		}
		*p.to = float32(*p.v)
	}
	return so, nil
}

// room is how many tokens a reply to a prompt of promptLen tokens has before the context is
// full: at least one, else an error.
// fits refuses a prompt of n bytes that cannot fit the context whatever its tokens, before it
// is tokenized: a multi-megabyte body would otherwise cost seconds and its size in memory
// only to be refused.
func (s *Server) fits(param string, n int) *reqError {
	ctx := s.model.ContextLength()
	if n/s.maxTokenBytes < ctx {
		return nil
	}
	return &reqError{status: http.StatusBadRequest, typ: "invalid_request_error", param: param, code: "context_length_exceeded",
		msg: fmt.Sprintf("the prompt is %d bytes, at least %d tokens, and the context %d: no room for a reply", n, n/s.maxTokenBytes, ctx)}
}

// contentBytes is the bytes of the messages' text.
func contentBytes(msgs []engine.Message) int {
	n := 0
	for _, m := range msgs {
		n += len(m.Content)
	}
	return n
}

func (s *Server) room(promptLen int) (int, error) {
	ctx := s.model.ContextLength()
	if promptLen >= ctx {
		return 0, fmt.Errorf("the prompt is %d tokens and the context %d: no room for a reply", promptLen, ctx)
	}
	return ctx - promptLen, nil
}

// logprobOptions reads the log-probability fields: a chat's logprobs (true or false) and
// top_logprobs (0 to 20), a completion's logprobs (the top count, 0 to 5).
func logprobOptions(q *sampling, chat bool, o *engine.GenerateOptions) *reqError {
	if chat {
		if present(q.Logprobs) {
			if err := json.Unmarshal(q.Logprobs, &o.Logprobs); err != nil {
				return invalid("logprobs", "logprobs: want true or false")
			}
		}
		if q.TopLogprobs != nil {
			if !o.Logprobs || *q.TopLogprobs < 0 || *q.TopLogprobs > 20 {
				return invalid("top_logprobs", "top_logprobs %d: want 0 to 20, with logprobs true", *q.TopLogprobs)
			}
			o.TopLogprobs = *q.TopLogprobs
		}
		return nil
	}
	if q.TopLogprobs != nil {
		return invalid("top_logprobs", "top_logprobs: a chat's field; a completion's count is logprobs")
	}
	if !present(q.Logprobs) {
		return nil
	}
	var n int
	if err := json.Unmarshal(q.Logprobs, &n); err != nil || n < 0 || n > 5 {
		return invalid("logprobs", "logprobs %s: want 0 to 5, the likeliest tokens returned at each position", q.Logprobs)
	}
	o.Logprobs, o.TopLogprobs = true, n
	return nil
}

func present(raw json.RawMessage) bool {
	return len(raw) > 0 && string(raw) != "null" && string(raw) != "[]"
}

// stopStrings reads stop: null, a string, or an array of up to 4 strings.
func stopStrings(raw json.RawMessage) ([]string, *reqError) {
	if !present(raw) {
		return nil, nil
	}
	var one string
	if json.Unmarshal(raw, &one) == nil {
		if one == "" {
			return nil, nil
		}
		return []string{one}, nil
	}
	var many []string
	if err := json.Unmarshal(raw, &many); err != nil {
		return nil, invalid("stop", "stop: want a string or an array of strings")
	}
	if len(many) > 4 {
		return nil, invalid("stop", "stop: %d strings, want at most 4", len(many))
	}
	return slices.DeleteFunc(many, func(s string) bool { return s == "" }), nil
}

// chatMessages reads a chat's messages: roles system (or developer), user, assistant (with
// the tool calls it made) and tool (a call's result, by its tool_call_id), each with text
// content, a string or an array of text parts.
func chatMessages(in []chatMessage) ([]engine.Message, *reqError) {
	if len(in) == 0 {
		return nil, invalid("messages", "messages: want at least one message")
	}
	out := make([]engine.Message, len(in))
	names := map[string]string{} // call id -> function, for the results that answer them
	for i, m := range in {
		param := fmt.Sprintf("messages[%d]", i)
		switch m.Role {
		case "system", "user", "assistant", "tool":
		case "developer":
			m.Role = "system"
		case "function":
			return nil, invalid(param+".role", "%s.role \"function\" is OpenAI's deprecated form of tool results: send role \"tool\" with tool_call_id", param)
		default:
			return nil, invalid(param+".role", "%s.role %q: want system, developer, user, assistant or tool", param, m.Role)
		}
		text, err := content(m.Content)
		if err != nil {
			return nil, invalid(param+".content", "%s.content: %v", param, err)
		}
		out[i] = engine.Message{Role: m.Role, Content: text, ToolCallID: m.ToolCallID, Name: m.Name}
		if len(m.ToolCalls) > 0 && m.Role != "assistant" {
			return nil, invalid(param+".tool_calls", "%s.tool_calls: only an assistant message makes calls", param)
		}
		for j, c := range m.ToolCalls {
			if c.Function.Name == "" || c.ID == "" {
				return nil, invalid(fmt.Sprintf("%s.tool_calls[%d]", param, j), "%s.tool_calls[%d]: want its id and function name", param, j)
			}
			names[c.ID] = c.Function.Name
			out[i].ToolCalls = append(out[i].ToolCalls, engine.ToolCall{ID: c.ID, Name: c.Function.Name, Arguments: c.Function.Arguments})
		}
		if m.Role == "tool" {
			if m.ToolCallID == "" {
				return nil, invalid(param+".tool_call_id", "%s: a tool message needs the tool_call_id of the call it answers", param)
			}
			if out[i].Name == "" {
				out[i].Name = names[m.ToolCallID]
			}
		}
	}
	return out, nil
}

// content reads a message's content: a string, or an array of parts of type text.
func content(raw json.RawMessage) (string, error) {
	if !present(raw) {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", errors.New("want a string or an array of content parts")
	}
	var text string
	for _, p := range parts {
		if p.Type != "text" {
			return "", fmt.Errorf("a part of type %q: only text is supported", p.Type)
		}
		text += p.Text
	}
	return text, nil
}

// promptText reads a completion's prompt: a string, or an array of one string.
func promptText(raw json.RawMessage) (string, *reqError) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		if s == "" {
			return "", invalid("prompt", "prompt: empty")
		}
		return s, nil
	}
	var many []string
	if json.Unmarshal(raw, &many) == nil && len(many) == 1 && many[0] != "" {
		return many[0], nil
	}
	return "", invalid("prompt", "prompt: want a non-empty string (or an array of one)")
}

func (s *Server) chatCompletions(w http.ResponseWriter, r *http.Request) {
	if !s.loaded(w) {
		return
	}
	var q chatRequest
	if err := decode(r, &q); err != nil {
		err.write(w)
		return
	}
	msgs, rerr := chatMessages(q.Messages)
	if rerr != nil {
		rerr.write(w)
		return
	}
	tools, choice, rerr := openaiTools(&q)
	if rerr != nil {
		rerr.write(w)
		return
	}
	t, err := s.newTooling(tools, choice)
	if err != nil {
		param := "tools"
		if choice.Mode != toolcall.Auto {
			param = "tool_choice"
		}
		invalid(param, "%s: %v", param, err).write(w)
		return
	}
	q.tools = t
	reserve := s.model.ContextLength()
	for _, v := range []*int{q.MaxTokens, q.MaxCompletionTokens} {
		if v != nil {
			reserve = min(reserve, *v)
		}
	}
	co := t.chatOptions()
	for k := range q.ChatTemplateKwargs {
		switch k {
		case "messages", "tools", "add_generation_prompt", "bos_token", "eos_token", "unk_token", "raise_exception", "strftime_now":
			invalid("chat_template_kwargs", "chat_template_kwargs: %q is the template's own variable, set by the server", k).write(w)
			return
		}
	}
	co.Vars = q.ChatTemplateKwargs
	ids, rerr := s.chatTokens(w, msgs, reserve, co)
	if rerr != nil {
		rerr.write(w)
		return
	}
	s.generate(w, r, &q.sampling, ids, true)
}

func (s *Server) completions(w http.ResponseWriter, r *http.Request) {
	if !s.loaded(w) {
		return
	}
	var q completionRequest
	if err := decode(r, &q); err != nil {
		err.write(w)
		return
	}
	text, rerr := promptText(q.Prompt)
	if rerr != nil {
		rerr.write(w)
		return
	}
	if err := s.fits("prompt", len(text)); err != nil {
		err.write(w)
		return
	}
	ids, err := s.model.Tokenize(text, true)
	if err != nil {
		invalid("prompt", "prompt: %v", err).write(w)
		return
	}
	s.generate(w, r, &q.sampling, ids, false)
}

// usage is OpenAI's token accounting.
type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
	// PromptTokensDetails.CachedTokens are the prompt's tokens the KV cache held already.
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// generate runs one request on the session once its turn comes, and answers it as a whole or
// as server-sent events.
func (s *Server) generate(w http.ResponseWriter, r *http.Request, q *sampling, ids []int32, chat bool) {
	opts, rerr := s.options(q, len(ids), chat)
	if rerr != nil {
		rerr.write(w)
		return
	}
	tm := &timer{m: s.met, start: time.Now()}
	sess, release, ok := s.admit(w, r, ids)
	if !ok {
		return
	}
	defer release()
	s.met.prompt.Add(float64(len(ids)))
	rp := reply{s: s, w: w, r: r, chat: chat, id: newID("cmpl-"), object: "text_completion", created: time.Now().Unix(), tools: q.tools}
	if chat {
		rp.id, rp.object = newID("chatcmpl-"), "chat.completion"
	}
	if !q.Stream {
		opts.OnToken = func(t engine.Token) error {
			if t.ID >= 0 {
				tm.token()
			}
			return nil
		}
		res, err := sess.Generate(r.Context(), ids, opts)
		release()
		rp.whole(res, err, opts.Logprobs)
		return
	}
	rp.stream(q, func(on func(engine.Token) error) (engine.Result, error) {
		opts.OnToken = func(t engine.Token) error {
			if t.ID >= 0 {
				tm.token()
			}
			return on(t)
		}
		res, err := sess.Generate(r.Context(), ids, opts)
		release()
		return res, err
	})
}

// reply is the answer to one completion request: its identity, and where it goes.
type reply struct {
	s          *Server
	w          http.ResponseWriter
	r          *http.Request
	chat       bool
	id, object string
	created    int64
	tools      *tooling // a chat's tools, nil without
}

// whole answers with the result of a generation at once.
func (rp *reply) whole(res engine.Result, err error, logprobs bool) {
	if err != nil {
		status, msg := failure(rp.r, err)
		if status == http.StatusServiceUnavailable {
			rp.w.Header().Set("Retry-After", "1")
		}
		writeError(rp.w, status, "server_error", msg, "")
		return
	}
	choice := map[string]any{"index": 0, "finish_reason": finishReason(res.Reason), "logprobs": nil}
	if p := rp.tools.parser(); p != nil {
		p.Add(res.Text)
		p.Finish()
		msg := map[string]any{"role": "assistant", "content": p.Content()}
		if r := p.Reasoning(); r != "" {
			msg["reasoning_content"] = r // llama-server's field, which the chat page shows apart
		}
		if calls := p.Calls(); len(calls) > 0 {
			msg["tool_calls"] = openaiCalls(calls)
			if p.Content() == "" {
				msg["content"] = nil
			}
			choice["finish_reason"] = callsFinish(res.Reason)
		}
		choice["message"] = msg
	} else if rp.chat {
		choice["message"] = map[string]any{"role": "assistant", "content": res.Text}
	} else {
		choice["text"] = res.Text
	}
	if logprobs {
		choice["logprobs"] = rp.s.logprobs(res.Logprobs, rp.chat, 0)
	}
	writeJSON(rp.w, http.StatusOK, map[string]any{"id": rp.id, "object": rp.object, "created": rp.created, "model": rp.s.name,
		"choices": []any{choice}, "usage": usageOf(res), "timings": timingsOf(res)})
}

// stream answers as server-sent events, a chunk per token that run hands to its callback,
// then the finish reason, the usage where asked, and [DONE].
func (rp *reply) stream(q *sampling, run func(on func(engine.Token) error) (engine.Result, error)) {
	w := rp.w
	fl, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rp.object += ".chunk"
	if !rp.chat {
		rp.object = "text_completion"
	}
	send := func(v any) error {
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
			return err
		}
		if fl != nil {
			fl.Flush()
		}
		return nil
	}
	c := chunker{reply: rp, includeUsage: q.StreamOptions != nil && q.StreamOptions.IncludeUsage, hitRate: rp.s.replyHitRate()}
	if rp.chat {
		if send(c.chunk("", true, nil, nil)) != nil {
			return
		}
	}
	tp := rp.tools.parser()
	res, err := run(func(t engine.Token) error {
		if tp != nil {
			d := tp.Add(t.Text)
			if d.Empty() && t.Logprob == nil {
				return nil
			}
			return send(c.toolChunk(d, t.Logprob))
		}
		if t.Text == "" && t.Logprob == nil {
			return nil
		}
		return send(c.chunk(t.Text, false, nil, t.Logprob))
	})
	if err != nil {
		// OpenAI's error event, and no [DONE]: the SDKs raise it instead of returning a cut
		// answer as whole.
		var e apiError
		_, e.Error.Message = failure(rp.r, err)
		e.Error.Type = "server_error"
		send(e)
		return
	}
	finish := finishReason(res.Reason)
	if tp != nil {
		if d := tp.Finish(); !d.Empty() && send(c.toolChunk(d, nil)) != nil {
			return
		}
		if len(tp.Calls()) > 0 {
			finish = callsFinish(res.Reason)
		}
	}
	last := c.chunk("", false, finish, nil)
	last["timings"] = timingsOf(res)
	if send(last) != nil {
		return
	}
	if c.includeUsage {
		if send(map[string]any{"id": rp.id, "object": rp.object, "created": rp.created, "model": rp.s.name, "choices": []any{}, "usage": usageOf(res)}) != nil {
			return
		}
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
	if fl != nil {
		fl.Flush()
	}
}

// chunker makes a stream's chunks.
type chunker struct {
	*reply
	includeUsage bool
	hitRate      func() (float64, bool)
	offset       int // a completion's text so far, where each token's logprobs say it starts
}

// chunk is one chunk of the stream: text, the role on a chat's first, a finish reason on the
// last, and the logprobs of the token it carries.
func (c *chunker) chunk(text string, role bool, finish any, lp *engine.Logprob) map[string]any {
	ch := map[string]any{"index": 0, "finish_reason": finish, "logprobs": nil}
	if lp != nil {
		ch["logprobs"] = c.s.logprobs([]engine.Logprob{*lp}, c.chat, c.offset)
	}
	c.offset += len(text)
	if c.chat {
		delta := map[string]any{}
		if role {
			delta["role"] = "assistant"
		}
		if text != "" || role {
			delta["content"] = text
		}
		ch["delta"] = delta
	} else {
		ch["text"] = text
	}
	out := map[string]any{"id": c.id, "object": c.object, "created": c.created, "model": c.s.name, "choices": []any{ch}}
	if rate, ok := c.hitRate(); ok {
		// commit-run's own: the reply's expert cache hit rate so far (the chat page draws
		// it); clients that do not know the field ignore it.
		out["commit_run"] = map[string]float64{"expert_hit_rate": rate}
	}
	if c.includeUsage {
		out["usage"] = nil // OpenAI's: null on every chunk but the last
	}
	return out
}

// toolChunk is a chunk of a chat with tools: the text and the news of calls a token made
// known (either may be empty; the token's logprobs go with it all the same).
func (c *chunker) toolChunk(d toolcall.Delta, lp *engine.Logprob) map[string]any {
	out := c.chunk(d.Content, false, nil, lp)
	delta := out["choices"].([]any)[0].(map[string]any)["delta"].(map[string]any)
	if len(d.Calls) > 0 {
		delta["tool_calls"] = openaiCallDeltas(d.Calls)
	}
	if d.Reasoning != "" {
		delta["reasoning_content"] = d.Reasoning
	}
	return out
}

// callsFinish is the finish reason of an answer that made calls: tool_calls, unless it was
// cut short.
func callsFinish(r engine.StopReason) string {
	if f := finishReason(r); f == "length" {
		return f
	}
	return "tool_calls"
}

// logprobs is a choice's log-probabilities in OpenAI's shape: a chat's content entries, or a
// completion's parallel arrays, whose text offsets start at offset.
func (s *Server) logprobs(ls []engine.Logprob, chat bool, offset int) any {
	text := func(id int32) string { return s.model.Detokenize([]int32{id}) }
	if chat {
		content := make([]map[string]any, len(ls))
		for i, l := range ls {
			top := make([]map[string]any, len(l.Top))
			for j, t := range l.Top {
				top[j] = map[string]any{"token": text(t.ID), "logprob": t.Logprob, "bytes": bytesOf(text(t.ID))}
			}
			content[i] = map[string]any{"token": text(l.ID), "logprob": l.Logprob, "bytes": bytesOf(text(l.ID)), "top_logprobs": top}
		}
		return map[string]any{"content": content, "refusal": nil}
	}
	var tokens []string
	var lps []float32
	var tops []map[string]float32
	var offsets []int
	for _, l := range ls {
		t := text(l.ID)
		tokens, lps, offsets = append(tokens, t), append(lps, l.Logprob), append(offsets, offset)
		offset += len(t)
		top := map[string]float32{}
		for _, c := range l.Top {
			top[text(c.ID)] = c.Logprob
		}
		tops = append(tops, top)
	}
	return map[string]any{"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}
}

// replyHitRate returns a function that says the expert cache's hit rate since it was made:
// the model's over the reply's time (one reply's when requests generate one at a time; with
// Options.Parallel the sequences batched with it share its lookups); ok is false without
// offloading or before the reply has looked for an expert.
func (s *Server) replyHitRate() func() (float64, bool) {
	st0, on := s.model.Offload()
	return func() (float64, bool) {
		if !on {
			return 0, false
		}
		st, _ := s.model.Offload()
		hits, all := st.Hits-st0.Hits, st.Hits+st.Misses-st0.Hits-st0.Misses
		return ratio(hits, all), all > 0
	}
}

// bytesOf is a token's UTF-8 bytes as OpenAI lists them: numbers, not base64.
func bytesOf(s string) []int {
	b := make([]int, len(s))
	for i := range len(s) {
		b[i] = int(s[i])
	}
	return b
}

func usageOf(res engine.Result) usage {
	u := usage{PromptTokens: res.PromptTokens, CompletionTokens: len(res.Tokens), TotalTokens: res.PromptTokens + len(res.Tokens)}
	u.PromptTokensDetails.CachedTokens = res.CachedTokens
	return u
}

// timingsOf is llama-server's timings of an answer, which its clients (and the chat page)
// take the rates from: the prompt's evaluated tokens (cache_n more were reused) and the
// generated ones, their milliseconds and rates, as the server measured them.
func timingsOf(res engine.Result) map[string]any {
	evaluated := res.PromptTokens - res.CachedTokens
	perSecond := func(n int, secs float64) float64 {
		if secs <= 0 {
			return 0
		}
		return float64(n) / secs
	}
	// The first token comes from the prompt's pass: the decode steps made the rest.
	decoded := max(len(res.Tokens)-1, 0)
	return map[string]any{"cache_n": res.CachedTokens, "prompt_n": evaluated, "prompt_ms": res.PromptSeconds * 1e3,
		"prompt_per_second": perSecond(evaluated, res.PromptSeconds), "predicted_n": len(res.Tokens),
		"predicted_ms": res.DecodeSeconds * 1e3, "predicted_per_second": perSecond(decoded, res.DecodeSeconds)}
}

// finishReason is OpenAI's name for why generation stopped.
func finishReason(r engine.StopReason) string {
	switch r {
	case engine.StopMaxTokens, engine.StopContext:
		return "length"
	default:
		return "stop"
	}
}

func newID(prefix string) string {
	b := make([]byte, 12)
	rand.Read(b)
	return prefix + hex.EncodeToString(b)
}
