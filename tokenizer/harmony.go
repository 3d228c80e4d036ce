package tokenizer

import (
	"encoding/json"
	"strings"
	"time"

	"github.com/nikolalohinski/gonja/v2/exec"
)

// renderHarmony is gpt-oss's chat template (OpenAI's harmony format) for conversations
// without tools: gonja v2.9.1 cannot parse the template the files carry (a conditional
// expression in parentheses), so this writes what Python's jinja2 renders from it, checked
// byte for byte against that render (testdata/chat/gptoss.txt). A system message becomes
// the developer message's instructions; earlier turns keep only their final answers; a
// turn's tool call and its result are written as the template writes them.
func renderHarmony(msgs []Message, gen bool, now time.Time, tools []json.RawMessage) string {
	if now.IsZero() {
		now = time.Now()
	}
	var b strings.Builder
	b.WriteString("<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n" +
		"Knowledge cutoff: 2024-06\nCurrent date: " + now.Format("2006-01-02") + "\n\nReasoning: medium\n\n" +
		"# Valid channels: analysis, commentary, final. Channel must be included for every message.")
	if len(tools) > 0 {
		b.WriteString("\nCalls to these tools must go to the commentary channel: 'functions'.")
	}
	b.WriteString("<|end|>")
	developer := ""
	if len(msgs) > 0 && (msgs[0].Role == "system" || msgs[0].Role == "developer") {
		developer, msgs = msgs[0].Content, msgs[1:]
	}
	if developer != "" || len(tools) > 0 {
		b.WriteString("<|start|>developer<|message|>")
		if developer != "" {
			b.WriteString("# Instructions\n\n" + developer + "\n\n")
		}
		if len(tools) > 0 {
			b.WriteString(harmonyTools(tools))
		}
		b.WriteString("<|end|>")
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

// harmonyTools is the developer message's tools as gpt-oss's template writes them: a
// TypeScript namespace of functions, each parameter with its description, type, optional
// mark and default. Schemas are read as the template reads them (see harmonyType).
func harmonyTools(tools []json.RawMessage) string {
	var b strings.Builder
	b.WriteString("# Tools\n\n## functions\n\nnamespace functions {\n\n")
	for _, raw := range tools {
		v, err := orderedJSON(raw)
		if err != nil {
			continue
		}
		fn, _ := dictGetKey(v, "function").(*exec.Dict)
		b.WriteString("// " + str(dictGetKey(fn, "description")) + "\n")
		b.WriteString("type " + str(dictGetKey(fn, "name")) + " = ")
		params, _ := dictGetKey(fn, "parameters").(*exec.Dict)
		props, _ := dictGetKey(params, "properties").(*exec.Dict)
		if props == nil || len(props.Pairs) == 0 {
			b.WriteString("() => any;\n\n")
			continue
		}
		required := dictGetKey(params, "required")
		b.WriteString("(_: {\n")
		for _, p := range props.Pairs {
			spec, _ := p.Value.Interface().(*exec.Dict)
			if d := str(dictGetKey(spec, "description")); d != "" {
				b.WriteString("// " + d + "\n")
			}
			b.WriteString(p.Key.String() + optional(p.Key.String(), required) + ": " + harmonyType(spec, required))
			if def := dictGetKey(spec, "default"); def != nil || hasKey(spec, "default") {
				switch {
				case dictGetKey(spec, "enum") != nil, dictGetKey(spec, "oneOf") != nil:
					b.WriteString(", // default: " + str(def))
				default:
					var s strings.Builder
					writePyJSON(&s, def, -1, 0)
					b.WriteString(", // default: " + s.String())
				}
			}
			b.WriteString(",\n")
		}
		b.WriteString("}) => any;\n\n")
	}
	b.WriteString("} // namespace functions")
	return b.String()
}

// harmonyType is the template's render_typescript_type for the common schemas: arrays of a
// type, strings (an enum's values), numbers, booleans, objects of properties (with the
// line break and indentation the template's source leaves before each property's type),
// lists of types, nullable; anything else is any.
func harmonyType(spec *exec.Dict, _ any) string {
	null := ""
	if truthy(dictGetKey(spec, "nullable")) {
		null = " | null"
	}
	switch t := dictGetKey(spec, "type").(type) {
	case string:
		switch t {
		case "array":
			items, ok := dictGetKey(spec, "items").(*exec.Dict)
			if !ok || items == nil || len(items.Pairs) == 0 {
				return "any[]" + null
			}
			switch str(dictGetKey(items, "type")) {
			case "string":
				return "string[]" + null
			case "number", "integer":
				return "number[]" + null
			case "boolean":
				return "boolean[]" + null
			}
			inner := harmonyType(items, nil)
			if inner == "object | object" || len(inner) > 50 {
				return "any[]" + null
			}
			return inner + "[]" + null
		case "string":
			if enum, ok := dictGetKey(spec, "enum").(pyList); ok && len(enum) > 0 {
				vals := make([]string, len(enum))
				for i, e := range enum {
					vals[i] = str(e)
				}
				return `"` + strings.Join(vals, `" | "`) + `"`
			}
			return "string" + null
		case "number", "integer":
			return "number"
		case "boolean":
			return "boolean"
		case "object":
			props, _ := dictGetKey(spec, "properties").(*exec.Dict)
			if props == nil || len(props.Pairs) == 0 {
				return "object"
			}
			required := dictGetKey(spec, "required")
			var b strings.Builder
			b.WriteString("{\n")
			for i, p := range props.Pairs {
				sub, _ := p.Value.Interface().(*exec.Dict)
				b.WriteString(p.Key.String() + optional(p.Key.String(), required) + ": \n" + strings.Repeat(" ", 16) + harmonyType(sub, required))
				if i < len(props.Pairs)-1 {
					b.WriteString(", ")
				}
			}
			return b.String() + "}"
		}
	case pyList:
		names := make([]string, len(t))
		for i, e := range t {
			names[i] = str(e)
		}
		return strings.Join(names, " | ")
	}
	return "any"
}

// dictGetKey is d[key] (nil: none).
func dictGetKey(d any, key string) any {
	dict, ok := d.(*exec.Dict)
	if !ok || dict == nil {
		return nil
	}
	for _, p := range dict.Pairs {
		if p.Key.String() == key {
			return p.Value.Interface()
		}
	}
	return nil
}

func hasKey(d *exec.Dict, key string) bool {
	if d == nil {
		return false
	}
	for _, p := range d.Pairs {
		if p.Key.String() == key {
			return true
		}
	}
	return false
}

// optional is "?" for a property not among required.
func optional(name string, required any) string {
	if list, ok := required.(pyList); ok {
		for _, r := range list {
			if r == name {
				return ""
			}
		}
	}
	return "?"
}

// str is a value as the template's string concatenation writes it (nil: "").
func str(v any) string {
	switch v := v.(type) {
	case nil:
		return ""
	case string:
		return v
	case *exec.Value:
		return str(v.Interface())
	}
	var b strings.Builder
	if writePyJSON(&b, v, -1, 0) != nil {
		return ""
	}
	return b.String()
}

func truthy(v any) bool {
	switch v := v.(type) {
	case nil:
		return false
	case bool:
		return v
	case string:
		return v != ""
	}
	return true
}
