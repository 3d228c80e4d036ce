package toolcall

import (
	"strings"

	"github.com/commit-run/commit-run/grammar"
)

// harmony is gpt-oss's format (OpenAI's harmony): an answer is messages on channels, the
// reasoning on analysis, the answer on final, and a call on commentary addressed to the
// function, its arguments the message:
//
//	<|channel|>analysis<|message|>The user asks...<|end|><|start|>assistant<|channel|>final<|message|>It is sunny.
//	<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>
//
// Its Parser gives the analysis channel as Reasoning and the final channel as Content, so
// every answer of a harmony model is read with it, tools or not (Always).
type harmony struct{}

func init() { register(harmony{}) }

const (
	hmStart   = "<|start|>"
	hmChannel = "<|channel|>"
	hmMessage = "<|message|>"
	hmTo      = "to=functions."
)

// hmEnds are the tokens that end a message; <|call|> and <|return|> also end generation.
var hmEnds = []string{"<|end|>", "<|call|>", "<|return|>"}

func (harmony) Name() string { return "harmony" }

func (harmony) NewID() string { return "call_" + randomID(24) }

// Grammar holds the model to one call on the commentary channel; <|call|>, an end of
// generation, follows the arguments.
func (harmony) Grammar(tools []Tool, _ bool) (*grammar.Grammar, error) {
	if len(tools) == 0 {
		return nil, errNoTools
	}
	alts := make([]grammar.Alt, len(tools))
	for i, t := range tools {
		alts[i] = grammar.Alt{Lit: t.Name + " <|constrain|>json" + hmMessage, Then: []grammar.Part{arguments(t)}}
	}
	return grammar.Text("harmony tool call", grammar.Lit(hmChannel+"commentary "+hmTo), grammar.OneOf(alts...))
}

func (harmony) Write(calls []Call) string {
	return joinCalls(calls, hmChannel+"commentary "+hmTo+"%s <|constrain|>json"+hmMessage+"%s<|call|>", hmStart+"assistant")
}

func (harmony) starts() []string { return []string{hmChannel, hmStart} }

// section reads one message: its header (channel and recipient), then its body up to the
// token that ends it.
func (harmony) section(text string, final bool) (section, error) {
	hdr := text
	if strings.HasPrefix(hdr, hmStart) {
		hdr = strings.TrimPrefix(hdr[len(hmStart):], "assistant")
	}
	m := strings.Index(hdr, hmMessage)
	if m < 0 {
		if final || len(hdr) > 200 || strings.ContainsAny(hdr, "\n") {
			return section{}, errNoName
		}
		return section{}, nil
	}
	header, body := hdr[:m], hdr[m+len(hmMessage):]
	channel, to := harmonyHeader(header)
	end, endLen := len(body), 0
	for _, e := range hmEnds {
		if i := strings.Index(body, e); i >= 0 && i < end {
			end, endLen = i, len(e)
		}
	}
	whole := endLen > 0 || final
	if endLen == 0 && !final {
		body = body[:len(body)-heldEnd(body)]
	} else {
		body = body[:end]
	}
	var sec section
	if whole {
		sec.n = len(text) - len(hdr) + m + len(hmMessage) + end + endLen
	}
	switch {
	case to != "":
		if !validName(to) {
			return section{}, errNoName
		}
		c := partial{name: to, args: streamed(body)}
		if whole {
			c.args, c.complete = finalArgs(body), true
		}
		sec.calls = []partial{c}
	case channel == "analysis":
		sec.reasoning = body
	default:
		sec.content = body
	}
	return sec, nil
}

// harmonyHeader reads a message's channel and recipient function.
func harmonyHeader(h string) (channel, to string) {
	if i := strings.Index(h, hmTo); i >= 0 {
		to = h[i+len(hmTo):]
		to, _, _ = strings.Cut(to, " ")
		to, _, _ = strings.Cut(to, "<")
	}
	if i := strings.Index(h, hmChannel); i >= 0 {
		channel = h[i+len(hmChannel):]
		channel, _, _ = strings.Cut(channel, " ")
		channel, _, _ = strings.Cut(channel, "<")
	}
	return channel, to
}

// heldEnd is how many bytes at the end of s could begin a message's end token.
func heldEnd(s string) int {
	keep := 0
	for _, e := range hmEnds {
		for k := min(len(e)-1, len(s)); k > keep; k-- {
			if strings.HasSuffix(s, e[:k]) {
				keep = k
				break
			}
		}
	}
	return keep
}
