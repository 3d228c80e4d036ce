package server

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/ollama/ollama/api"
	"github.com/ollama/ollama/types/model"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/toolcall"
)

// ollama's API, with ollama's own request and response types (github.com/ollama/ollama/api),
// so that the field names and options are its: POST /api/chat and /api/generate (streamed as
// NDJSON by default), GET /api/tags, POST /api/show, GET /api/ps, GET /api/version. Errors are
// its shape, {"error": "..."}.

// ollamaVersion is what GET /api/version answers: tools check it against the features they
// use, and this server speaks the API of this ollama release.
const ollamaVersion = "0.17.4"

func ollamaError(w http.ResponseWriter, status int, format string, a ...any) {
	writeJSON(w, status, map[string]string{"error": fmt.Sprintf(format, a...)})
}

// ollamaCheck answers what every ollama route refuses alike: a model still loading, a body
// that does not decode, a model not served. It returns false when it has answered.
func (s *Server) ollamaCheck(w http.ResponseWriter, r *http.Request, v any, model func() string) bool {
	if !s.ready.Load() {
		w.Header().Set("Retry-After", "1")
		ollamaError(w, http.StatusServiceUnavailable, "the model is still loading")
		return false
	}
	if v != nil {
		if err := decode(r, v); err != nil {
			ollamaError(w, err.status, "%s", err.msg)
			return false
		}
	}
	if m := model(); !s.serves(m) {
		ollamaError(w, http.StatusNotFound, "model %q not found; this server serves %q", m, s.name)
		return false
	}
	return true
}

func (s *Server) ollamaChat(w http.ResponseWriter, r *http.Request) {
	var q api.ChatRequest
	if !s.ollamaCheck(w, r, &q, func() string { return q.Model }) {
		return
	}
	if len(q.Messages) == 0 {
		// ollama loads the model and answers done: it is loaded already.
		writeJSON(w, http.StatusOK, api.ChatResponse{Model: s.name, CreatedAt: time.Now().UTC(), Message: api.Message{Role: "assistant"}, Done: true, DoneReason: "load"})
		return
	}
	msgs, err := ollamaMessages(q.Messages)
	if err != nil {
		ollamaError(w, http.StatusBadRequest, "%v", err)
		return
	}
	tools, err := ollamaTools(q.Tools)
	if err != nil {
		ollamaError(w, http.StatusBadRequest, "%v", err)
		return
	}
	t, err := s.newTooling(tools, engine.ToolChoice{Parallel: true})
	if err != nil {
		ollamaError(w, http.StatusBadRequest, "tools: %v", err)
		return
	}
	ids, rerr := s.chatTokens(w, msgs, s.model.ContextLength(), t.chatOptions())
	if rerr != nil {
		ollamaError(w, rerr.status, "%s", rerr.msg)
		return
	}
	s.ollamaGenerate(w, r, ids, ollamaRun{raw: q.Options, format: q.Format, stream: q.Stream, chat: true, templated: true, tools: t})
}

// ollamaMessages reads a chat's messages: system, user, assistant (with its calls) and tool
// (a call's result, by tool_name or tool_call_id).
func ollamaMessages(in []api.Message) ([]engine.Message, error) {
	msgs := make([]engine.Message, len(in))
	for i, m := range in {
		switch {
		case m.Role != "system" && m.Role != "user" && m.Role != "assistant" && m.Role != "tool":
			return nil, fmt.Errorf("messages[%d]: role %q: want system, user, assistant or tool", i, m.Role)
		case len(m.Images) > 0:
			return nil, fmt.Errorf("messages[%d]: images are not supported by this model", i)
		}
		calls, err := ollamaMessageCalls(m.ToolCalls)
		if err != nil {
			return nil, fmt.Errorf("messages[%d].tool_calls: %v", i, err)
		}
		msgs[i] = engine.Message{Role: m.Role, Content: m.Content, ToolCalls: calls, ToolCallID: m.ToolCallID, Name: m.ToolName}
	}
	return msgs, nil
}

func (s *Server) ollamaGenerateRoute(w http.ResponseWriter, r *http.Request) {
	var q api.GenerateRequest
	if !s.ollamaCheck(w, r, &q, func() string { return q.Model }) {
		return
	}
	if len(q.Images) > 0 || q.Suffix != "" || q.Template != "" || len(q.Context) > 0 {
		ollamaError(w, http.StatusBadRequest, "images, suffix, template and context are not supported by this server")
		return
	}
	if q.Prompt == "" {
		writeJSON(w, http.StatusOK, api.GenerateResponse{Model: s.name, CreatedAt: time.Now().UTC(), Done: true, DoneReason: "load"})
		return
	}
	if err := s.fits("prompt", len(q.Prompt)+len(q.System)); err != nil {
		ollamaError(w, err.status, "%s", err.msg)
		return
	}
	var ids []int32
	var err error
	if q.Raw {
		ids, err = s.model.Tokenize(q.Prompt, true)
	} else {
		// ollama renders a prompt through the model's template, with the system message.
		var msgs []engine.Message
		if q.System != "" {
			msgs = append(msgs, engine.Message{Role: "system", Content: q.System})
		}
		ids, err = s.model.ChatTokens(append(msgs, engine.Message{Role: "user", Content: q.Prompt}))
	}
	if err != nil {
		ollamaError(w, http.StatusBadRequest, "prompt: %v", err)
		return
	}
	s.ollamaGenerate(w, r, ids, ollamaRun{raw: q.Options, format: q.Format, stream: q.Stream, templated: !q.Raw})
}

// ollamaOptions are ollama's options (its defaults, then the request's) and format as the
// engine's, for a prompt of promptLen tokens, with the model's chat stop strings when it is
// templated and free.
func (s *Server) ollamaOptions(raw map[string]any, format json.RawMessage, promptLen int, templated bool, t *tooling) (engine.GenerateOptions, error) {
	var g engine.GenerateOptions
	f, err := ollamaFormat(format)
	if err != nil {
		return g, err
	}
	if err := t.constrain(&g, f); err != nil {
		return g, fmt.Errorf("format: %v", err)
	}
	o := api.DefaultOptions()
	if err := o.FromMap(raw); err != nil {
		return g, err
	}
	if err := ollamaRanges(&o); err != nil {
		return g, err
	}
	room, err := s.room(promptLen)
	if err != nil {
		return g, err
	}
	switch {
	case o.NumPredict < -2:
		return g, fmt.Errorf("num_predict %d: want -1 (until done), -2 (fill the context) or more", o.NumPredict)
	case o.NumPredict > 0:
		g.MaxTokens = min(o.NumPredict, room)
	default:
		g.MaxTokens = room
	}
	if o.MinP != 0 || o.TypicalP != 1 {
		return g, fmt.Errorf("min_p and typical_p are not supported by this server")
	}
	g.Sampler = engine.SamplerOptions{Temperature: o.Temperature, TopK: o.TopK, TopP: o.TopP, RepeatPenalty: o.RepeatPenalty,
		RepeatLastN: o.RepeatLastN, PresencePenalty: o.PresencePenalty, FrequencyPenalty: o.FrequencyPenalty, Greedy: o.Temperature == 0}
	if o.RepeatLastN < 0 {
		g.Sampler.RepeatLastN = s.model.ContextLength() // ollama's -1: the whole context
	}
	g.Sampler.Seed = uint64(o.Seed)
	if o.Seed < 0 {
		g.Sampler.Seed = uint64(time.Now().UnixNano())
	}
	g.Stop = slices.DeleteFunc(slices.Clone(o.Stop), func(s string) bool { return s == "" })
	if templated && (g.Grammar == nil || g.GrammarTrigger != "") {
		g.Stop = append(g.Stop, s.model.Info().ChatStop...) // as in options, for OpenAI's API
	}
	return g, nil
}

// ollamaRanges takes ollama's sampling options as llama.cpp, under ollama, takes them: a
// temperature below 0 is greedy, a top_k below 1 is off, a top_p is held to 0..1. Values with
// no such meaning are refused, named, before the answer starts: never a 500, nor a 200 whose
// stream ends in an error line.
func ollamaRanges(o *api.Options) error {
	o.Temperature = max(o.Temperature, 0)
	o.TopK = max(o.TopK, 0)
	o.TopP = min(max(o.TopP, 0), 1)
	switch {
	case o.Temperature > 100:
		return fmt.Errorf("temperature %g: want 0 to 100 (0 or less: greedy)", o.Temperature)
	case o.RepeatPenalty < 0 || o.RepeatPenalty > 100:
		return fmt.Errorf("repeat_penalty %g: want 0 to 100 (1: off)", o.RepeatPenalty)
	case o.RepeatLastN < -1:
		return fmt.Errorf("repeat_last_n %d: want -1 (the whole context), 0 (off) or more", o.RepeatLastN)
	case o.PresencePenalty < -100 || o.PresencePenalty > 100:
		return fmt.Errorf("presence_penalty %g: want -100 to 100 (0: off)", o.PresencePenalty)
	case o.FrequencyPenalty < -100 || o.FrequencyPenalty > 100:
		return fmt.Errorf("frequency_penalty %g: want -100 to 100 (0: off)", o.FrequencyPenalty)
	}
	return nil
}

// ollamaGenerate runs one request when its turn comes and answers it as ollama does: NDJSON
// lines (/api/chat's when chat, else /api/generate's), the last with done and the timings,
// or (stream false) that last line alone with the whole text. templated says the prompt went
// through the chat template, so that the model's chat stop strings apply.
// ollamaRun is what ollamaGenerate runs: the request's options and format, whether it
// streams, whether it is a chat, templated, and its tools.
type ollamaRun struct {
	raw             map[string]any
	format          json.RawMessage
	stream          *bool
	chat, templated bool
	tools           *tooling
}

func (s *Server) ollamaGenerate(w http.ResponseWriter, r *http.Request, ids []int32, q ollamaRun) {
	start := time.Now()
	opts, err := s.ollamaOptions(q.raw, q.format, len(ids), q.templated, q.tools)
	if err != nil {
		ollamaError(w, http.StatusBadRequest, "%v", err)
		return
	}
	tm := &timer{m: s.met, start: start}
	sess, release, ok := s.admit(w, r, ids)
	if !ok {
		return
	}
	defer release()
	s.met.prompt.Add(float64(len(ids)))
	o := &ollamaReply{s: s, w: w, enc: json.NewEncoder(w), chat: q.chat, streaming: q.stream == nil || *q.stream, tp: q.tools.parser()}
	o.fl, _ = w.(http.Flusher)
	if o.streaming {
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.WriteHeader(http.StatusOK)
	}
	opts.OnToken = func(t engine.Token) error {
		if t.ID >= 0 {
			tm.token()
		}
		return o.token(t)
	}
	res, err := sess.Generate(r.Context(), ids, opts)
	release()
	if err != nil {
		ollamaFailed(w, r, o.enc, err, o.streaming)
		return
	}
	last, ok := o.last(res, start)
	switch {
	case !ok:
	case o.streaming:
		o.send(last)
	default:
		writeJSON(w, http.StatusOK, last)
	}
}

// ollamaReply is one answer on ollama's routes: its lines, streamed as NDJSON or written
// whole, with a chat's calls and reasoning read by tp (nil: plain text).
type ollamaReply struct {
	s               *Server
	w               http.ResponseWriter
	enc             *json.Encoder
	fl              http.Flusher
	chat, streaming bool
	tp              *toolcall.Parser
}

// line is a line of the answer: a chat's message or a generation's response.
func (o *ollamaReply) line(text string, done bool) any {
	if o.chat {
		return &api.ChatResponse{Model: o.s.name, CreatedAt: time.Now().UTC(), Message: api.Message{Role: "assistant", Content: text}, Done: done}
	}
	return &api.GenerateResponse{Model: o.s.name, CreatedAt: time.Now().UTC(), Response: text, Done: done}
}

func (o *ollamaReply) send(v any) error {
	if err := o.enc.Encode(v); err != nil {
		return err
	}
	if o.fl != nil {
		o.fl.Flush()
	}
	return nil
}

// token streams what a token added: its text, or what the parser made of it.
func (o *ollamaReply) token(t engine.Token) error {
	text, thinking := t.Text, ""
	if o.tp != nil {
		d := o.tp.Add(text)
		text, thinking = d.Content, d.Reasoning
	}
	if !o.streaming || text == "" && thinking == "" {
		return nil
	}
	l := o.line(text, false)
	if c, ok := l.(*api.ChatResponse); ok {
		c.Message.Thinking = thinking
	}
	return o.send(l)
}

// last is the done line, with the metrics; ollama gives calls whole, so a stream's calls
// (and the text's last piece) go in a line of their own before it. false: the stream broke.
func (o *ollamaReply) last(res engine.Result, start time.Time) (any, bool) {
	text := ""
	if !o.streaming {
		text = res.Text
	}
	var calls []api.ToolCall
	if o.tp != nil {
		fin := o.tp.Finish()
		if text, calls = fin.Content, ollamaCalls(o.tp.Calls()); !o.streaming {
			text = o.tp.Content()
		}
		if o.streaming && (text != "" || fin.Reasoning != "" || len(calls) > 0) {
			l := o.line(text, false).(*api.ChatResponse)
			l.Message.ToolCalls, l.Message.Thinking = calls, fin.Reasoning
			if o.send(l) != nil {
				return nil, false
			}
			text = ""
		}
	}
	last := o.line(text, true)
	m := api.Metrics{TotalDuration: time.Since(start), PromptEvalCount: res.PromptTokens, PromptEvalDuration: seconds(res.PromptSeconds),
		EvalCount: len(res.Tokens), EvalDuration: seconds(res.DecodeSeconds)}
	reason := finishReason(res.Reason)
	switch l := last.(type) {
	case *api.ChatResponse:
		l.Metrics, l.DoneReason = m, reason
		if !o.streaming && o.tp != nil {
			l.Message.ToolCalls, l.Message.Thinking = calls, o.tp.Reasoning()
		}
	case *api.GenerateResponse:
		l.Metrics, l.DoneReason = m, reason
	}
	return last, true
}

// ollamaFailed answers a generation that ended in err: ollama's error line in a stream, and
// no done line, which its clients raise instead of taking a cut answer for a whole one; or
// the error with its status.
func ollamaFailed(w http.ResponseWriter, r *http.Request, enc *json.Encoder, err error, streaming bool) {
	status, msg := failure(r, err)
	if streaming {
		enc.Encode(map[string]string{"error": msg})
		return
	}
	if status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	ollamaError(w, status, "%s", msg)
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// ollamaDetails describes the served model as ollama's lists do.
func (s *Server) ollamaDetails() api.ModelDetails {
	info := s.model.Info()
	quant := ""
	var most int64
	for t, b := range info.TensorTypeBytes {
		if b > most || b == most && t < quant {
			quant, most = strings.ToUpper(t), b
		}
	}
	return api.ModelDetails{Format: "gguf", Family: info.Architecture, Families: []string{info.Architecture},
		ParameterSize: fmt.Sprintf("%.1fB", float64(info.Parameters)/1e9), QuantizationLevel: quant}
}

// ollamaSize is the model file's size, and when it was last changed.
func (s *Server) ollamaSize() (int64, time.Time) {
	st, err := os.Stat(s.model.Info().Path)
	if err != nil {
		return 0, time.Time{}
	}
	return st.Size(), st.ModTime()
}

func (s *Server) ollamaTags(w http.ResponseWriter, r *http.Request) {
	if !s.ollamaCheck(w, r, nil, func() string { return "" }) {
		return
	}
	size, mod := s.ollamaSize()
	writeJSON(w, http.StatusOK, api.ListResponse{Models: []api.ListModelResponse{{Name: s.name + ":latest", Model: s.name + ":latest",
		ModifiedAt: mod, Size: size, Details: s.ollamaDetails()}}})
}

func (s *Server) ollamaPs(w http.ResponseWriter, r *http.Request) {
	if !s.ollamaCheck(w, r, nil, func() string { return "" }) {
		return
	}
	size, _ := s.ollamaSize()
	_, used, _ := s.model.DeviceMemory()
	writeJSON(w, http.StatusOK, api.ProcessResponse{Models: []api.ProcessModelResponse{{Name: s.name + ":latest", Model: s.name + ":latest",
		Size: size, Details: s.ollamaDetails(), ExpiresAt: time.Now().Add(100 * 365 * 24 * time.Hour).UTC(), SizeVRAM: used,
		ContextLength: s.model.ContextLength()}}})
}

func (s *Server) ollamaShow(w http.ResponseWriter, r *http.Request) {
	var q api.ShowRequest
	if !s.ollamaCheck(w, r, &q, func() string { return cmp.Or(q.Model, q.Name) }) {
		return
	}
	info := s.model.Info()
	_, mod := s.ollamaSize()
	writeJSON(w, http.StatusOK, api.ShowResponse{Template: info.ChatTemplate, Details: s.ollamaDetails(), ModifiedAt: mod,
		ModelInfo: map[string]any{
			"general.architecture":                   info.Architecture,
			"general.parameter_count":                info.Parameters,
			info.Architecture + ".context_length":    info.Context,
			info.Architecture + ".embedding_length":  info.Embedding,
			info.Architecture + ".block_count":       info.Layers,
			info.Architecture + ".expert_count":      info.Experts,
			info.Architecture + ".expert_used_count": info.ExpertsUsed,
		},
		Capabilities: []model.Capability{model.CapabilityCompletion}})
}

func (s *Server) ollamaVersion(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"version": ollamaVersion})
}
