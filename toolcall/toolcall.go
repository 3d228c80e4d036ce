// Package toolcall is function calling for chat models: which chat format a model's
// template writes calls in (Qwen's and Hermes' <tool_call> JSON, Qwen3-Coder's and Qwen3.5's
// XML, Mistral's [TOOL_CALLS], DeepSeek's and Kimi's tool-call tokens, GLM's argument tags,
// Llama 3's JSON, gpt-oss's harmony channels, or a generic JSON answer for templates that
// know no tools), the grammar that makes a model write a call in that format with arguments
// of the tool's schema (package grammar's text grammars), and a
// Parser that reads the calls back out of what the model writes, as it streams; and Render,
// which gives a chat's tools, calls and results to a template as far as it takes them and
// writes the rest for it.
//
// One small type per format, in a file of its own, registers itself; Detect picks one by
// the markers its template writes.
package toolcall

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"math/big"
	"slices"
	"strings"

	"github.com/commit-run/commit-run/grammar"
)

// Tool is a function the model may call.
type Tool struct {
	Name, Description string
	// Parameters is the JSON schema of the arguments (nil: any object).
	Parameters json.RawMessage
}

// Call is a call the model made.
type Call struct {
	ID, Name string
	// Arguments is the call's arguments as JSON text.
	Arguments string
}

// Mode is a request's tool_choice.
type Mode int

const (
	// Auto lets the model answer or call; calls it writes are parsed (and, for formats
	// without markers of their own, the answer is held to the generic JSON shape).
	Auto Mode = iota
	// None: no tools are offered and nothing is parsed.
	None
	// Required: the model must call one or more of the tools.
	Required
	// Named: the model must call the one tool named.
	Named
)

// Choice is what the model may do with the tools.
type Choice struct {
	Mode Mode
	// Name is the function Named calls.
	Name string
	// Parallel lets the model make several calls in one turn.
	Parallel bool
}

// Format is one chat format's way of writing tool calls.
type Format interface {
	// Name is the format's name ("hermes", "mistral", ...).
	Name() string
	// Grammar holds the model to calls of tools in the format: one, or several when
	// parallel. Formats that cannot be constrained return an error.
	Grammar(tools []Tool, parallel bool) (*grammar.Grammar, error)
	// NewID makes a call id of the shape the format's template accepts back.
	NewID() string
	// Write is the text a model writes for calls in the format: what a template that knows
	// no tool calls is given for a turn that made them, and the example SystemPrompt shows.
	Write(calls []Call) string
	scanner
}

// Triggered is a format whose calls begin with a marker of their own, which a model writes
// only to call: its Grammar can hold an answer that may also be text from that marker on
// (engine's GenerateOptions.GrammarTrigger), so that a call a model starts always parses.
type Triggered interface {
	Format
	Trigger() string
}

// scanner finds and reads the calls section of a model's answer (parser.go).
type scanner interface {
	// starts are the texts that open a calls section.
	starts() []string
	// section reads a calls section, text starting at its opening marker (final: the answer
	// has ended), or an error when it cannot be a section of this format (then it is text).
	section(text string, final bool) (section, error)
}

// section is a calls section as far as it has been read.
type section struct {
	// calls are the calls read so far; the last may be partial.
	calls []partial
	// n is the bytes the section took, once whole; 0 while it is open.
	n int
	// content is answer text the section stands for (the generic format's response), and
	// reasoning its reasoning (harmony's analysis channel), each as far as it is read.
	content, reasoning string
}

// partial is a call as far as it has been read: its name once whole, and its arguments'
// text so far, which only grows (a format that builds its arguments gives them when whole).
type partial struct {
	name     string
	args     string
	complete bool
}

var formats []Format

func register(f Format) { formats = append(formats, f) }

// ByName returns the registered format called name.
func ByName(name string) (Format, error) {
	for _, f := range formats {
		if f.Name() == name {
			return f, nil
		}
	}
	names := make([]string, len(formats))
	for i, f := range formats {
		names[i] = f.Name()
	}
	slices.Sort(names)
	return nil, fmt.Errorf("toolcall: no format %q (have %s)", name, strings.Join(names, ", "))
}

// Detect picks the format a chat template writes tool calls in, by its markers; a template
// with none (or no template) gets the generic JSON format, which needs the tools described
// in a message (SystemPrompt).
func Detect(template string) Format {
	name := "generic"
	switch {
	case strings.Contains(template, "[TOOL_CALLS]") && strings.Contains(template, "[ARGS]"):
		name = "mistral-v11"
	case strings.Contains(template, "[TOOL_CALLS]"):
		name = "mistral"
	case strings.Contains(template, "<｜tool▁calls▁begin｜>") && isV31(template):
		name = "deepseek3.1"
	case strings.Contains(template, "<｜tool▁calls▁begin｜>"):
		name = "deepseek"
	case strings.Contains(template, "<|tool_calls_section_begin|>"):
		name = "kimi"
	case strings.Contains(template, "</arg_value><arg_key>"):
		name = "glm4.7"
	case strings.Contains(template, "<arg_key>"):
		name = "glm4.5"
	case strings.Contains(template, "<function="):
		name = "qwen3coder"
	case strings.Contains(template, "<tool_call>"):
		name = "hermes"
	case strings.Contains(template, "<|python_tag|>"):
		name = "llama3"
	case strings.Contains(template, "<|channel|>"):
		name = "harmony"
	}
	f, _ := ByName(name)
	return f
}

// Always reports whether every answer in format f is read with a Parser, tools or not: a
// harmony answer's reasoning and text are channels of markup.
func Always(f Format) bool { return f.Name() == "harmony" }

// Native reports whether f is a format of the model's own, which its template tells it
// about; the generic format is not.
func Native(f Format) bool { return f.Name() != "generic" }

// SystemPrompt describes tools to a model whose template does not: their signatures and how
// to call them in format f (the generic format: the JSON answer its grammar holds the model
// to). It goes at the end of the system message, or is one.
func SystemPrompt(f Format, tools []Tool, choice Choice) string {
	if !Native(f) {
		return genericPrompt(tools, choice)
	}
	var b strings.Builder
	b.WriteString("# Tools\n\nYou may call one or more functions to assist with the user query. ")
	b.WriteString("You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
	for _, t := range OpenAITools(tools) {
		b.WriteString("\n")
		b.Write(t)
	}
	b.WriteString("\n</tools>\n\nTo call a function, write:\n")
	b.WriteString(f.Write([]Call{{Name: "<function-name>", Arguments: "<args-json-object>"}}))
	return b.String()
}

// OpenAITools is the tools as OpenAI's API writes them, what chat templates are given:
// type, then the function's name, description and parameters, in the order clients send.
func OpenAITools(tools []Tool) []json.RawMessage {
	out := make([]json.RawMessage, len(tools))
	for i, t := range tools {
		s := `{"type": "function", "function": {"name": ` + quote(t.Name)
		if t.Description != "" {
			s += `, "description": ` + quote(t.Description)
		}
		if t.Parameters != nil {
			s += `, "parameters": ` + string(t.Parameters)
		}
		out[i] = json.RawMessage(s + "}}")
	}
	return out
}

// quote is s as a JSON string, HTML characters as they are.
func quote(s string) string {
	var b strings.Builder
	e := json.NewEncoder(&b)
	e.SetEscapeHTML(false)
	e.Encode(s) // a string always encodes
	return strings.TrimSuffix(b.String(), "\n")
}

// Select narrows tools to what choice allows: the named tool alone for Named (an error if
// there is none of that name), none for None.
func Select(tools []Tool, choice Choice) ([]Tool, error) {
	switch choice.Mode {
	case None:
		return nil, nil
	case Named:
		for _, t := range tools {
			if t.Name == choice.Name {
				return []Tool{t}, nil
			}
		}
		return nil, fmt.Errorf("tool_choice names function %q, which is not among the tools", choice.Name)
	}
	return tools, nil
}

// Validate checks tools: names present, unique and of the characters OpenAI allows, and
// parameters a JSON object.
func Validate(tools []Tool) error {
	seen := map[string]bool{}
	for i, t := range tools {
		if !validName(t.Name) {
			return fmt.Errorf("tools[%d]: function name %q: want 1 to 64 of a-z, A-Z, 0-9, _, - and .", i, t.Name)
		}
		if seen[t.Name] {
			return fmt.Errorf("tools[%d]: function %q is declared twice", i, t.Name)
		}
		seen[t.Name] = true
		if t.Parameters != nil {
			var v any
			if err := json.Unmarshal(t.Parameters, &v); err != nil {
				return fmt.Errorf("tools[%d] (%s): parameters: %v", i, t.Name, err)
			}
			if _, ok := v.(map[string]any); !ok {
				return fmt.Errorf("tools[%d] (%s): parameters must be a JSON schema object", i, t.Name)
			}
		}
	}
	return nil
}

// validName says whether name is a function name OpenAI allows: 1 to 64 letters, digits,
// underscores, dashes and dots.
func validName(name string) bool {
	return name != "" && len(name) <= 64 && strings.IndexFunc(name, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-' || r == '.')
	}) < 0
}

// arguments is the grammar part of a tool's arguments: its schema, without the keywords
// package grammar cannot enforce (minimum, pattern, format: tools' schemas are full of
// them), or any object where the schema is beyond it (two objects in an anyOf): the call
// still parses, and the rest is the model's to get right.
func arguments(t Tool) grammar.Part {
	if t.Parameters == nil {
		return grammar.AnyObject()
	}
	if _, err := grammar.CompileLoose(t.Parameters); err != nil {
		return grammar.AnyObject()
	}
	return grammar.LooseValue(t.Parameters)
}

// calls is the grammar of the calls a format writes: open, then one call or several
// (sep between them), then close; a call is prefix, the tool's name followed by middle,
// its arguments, then suffix.
type calls struct {
	open, prefix, middle, suffix, sep, close string
}

func (c calls) grammar(desc string, tools []Tool, parallel bool) (*grammar.Grammar, error) {
	if len(tools) == 0 {
		return nil, errNoTools
	}
	var parts []grammar.Part
	if c.open != "" {
		parts = append(parts, grammar.Lit(c.open))
	}
	parts = append(parts, c.repeat(tools, parallel))
	if c.close != "" {
		parts = append(parts, grammar.Lit(c.close))
	}
	return grammar.Text(desc, parts...)
}

// repeat is the calls themselves: one, or one or more when parallel.
func (c calls) repeat(tools []Tool, parallel bool) grammar.Part {
	alts := make([]grammar.Alt, len(tools))
	for i, t := range tools {
		then := []grammar.Part{arguments(t)}
		if c.suffix != "" {
			then = append(then, grammar.Lit(c.suffix))
		}
		alts[i] = grammar.Alt{Lit: t.Name + c.middle, Then: then}
	}
	most := 1
	if parallel {
		most = -1
	}
	return grammar.Repeat(1, most, c.sep, grammar.Lit(c.prefix), grammar.OneOf(alts...))
}

var errNoTools = fmt.Errorf("toolcall: no tools to call")

const idChars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"

// randomID is n random letters and digits.
func randomID(n int) string {
	b := make([]byte, n)
	for i := range b {
		k, err := rand.Int(rand.Reader, big.NewInt(int64(len(idChars))))
		if err != nil {
			panic(err) // crypto/rand does not fail on the systems Go supports
		}
		b[i] = idChars[k.Int64()]
	}
	return string(b)
}
