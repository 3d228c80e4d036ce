package tokenizer

import (
	"strings"
	"time"
)

// renderHarmony is gpt-oss's chat template (OpenAI's harmony format) for conversations
// without tools: gonja v2.9.1 cannot parse the template the files carry (a conditional
// expression in parentheses), so this writes what Python's jinja2 renders from it, checked
// byte for byte against that render (testdata/chat/gptoss.txt). A system message becomes
// the developer message's instructions; earlier turns keep only their final answers; a
// turn's tool call and its result are written as the template writes them.
func renderHarmony(msgs []Message, gen bool, now time.Time) string {
	if now.IsZero() {
		now = time.Now()
	}
	var b strings.Builder
	b.WriteString("<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n" +
		"Knowledge cutoff: 2024-06\nCurrent date: " + now.Format("2006-01-02") + "\n\nReasoning: medium\n\n" +
		"# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|>")
	if len(msgs) > 0 && (msgs[0].Role == "system" || msgs[0].Role == "developer") {
		if msgs[0].Content != "" {
			b.WriteString("<|start|>developer<|message|># Instructions\n\n" + msgs[0].Content + "\n\n<|end|>")
		}
		msgs = msgs[1:]
	}
	lastCall := ""
	for i, m := range msgs {
		switch m.Role {
		case "user":
			b.WriteString("<|start|>user<|message|>" + m.Content + "<|end|>")
		case "assistant":
			if len(m.ToolCalls) > 0 {
				c := m.ToolCalls[0] // the template writes one call a turn
				if m.Content != "" && !finalAfter(msgs[i+1:]) {
					b.WriteString("<|start|>assistant<|channel|>analysis<|message|>" + m.Content + "<|end|>")
				}
				b.WriteString("<|start|>assistant to=functions." + c.Name + "<|channel|>commentary json<|message|>" + harmonyArgs(c.Arguments) + "<|call|>")
				lastCall = c.Name
				continue
			}
			end := "<|end|>"
			if i == len(msgs)-1 && !gen {
				end = "<|return|>"
			}
			b.WriteString("<|start|>assistant<|channel|>final<|message|>" + m.Content + end)
			lastCall = ""
		case "tool":
			var s strings.Builder
			writePyString(&s, m.Content)
			b.WriteString("<|start|>functions." + lastCall + " to=assistant<|channel|>commentary<|message|>" + s.String() + "<|end|>")
		}
	}
	if gen {
		b.WriteString("<|start|>assistant")
	}
	return b.String()
}

// finalAfter says whether a later assistant turn answers without calling.
func finalAfter(msgs []Message) bool {
	for _, m := range msgs {
		if m.Role == "assistant" && len(m.ToolCalls) == 0 {
			return true
		}
	}
	return false
}

// harmonyArgs is a call's arguments as the template's tojson writes the object.
func harmonyArgs(args string) string {
	v, err := orderedJSON([]byte(args))
	if err != nil {
		var s strings.Builder
		writePyString(&s, args)
		return s.String()
	}
	var b strings.Builder
	if writePyJSON(&b, v, -1, 0) != nil {
		return args
	}
	return b.String()
}
