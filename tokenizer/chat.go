package tokenizer

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/nikolalohinski/gonja/v2/builtins"
	"github.com/nikolalohinski/gonja/v2/config"
	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/loaders"
)

// Message is one chat turn. Role is "system", "user", "assistant" or "tool" (a template
// may know others).
type Message struct {
	Role, Content string
	// ToolCalls are the calls an assistant turn made.
	ToolCalls []ToolCall
	// ToolCallID and Name say which call a tool turn answers and the function's name.
	ToolCallID, Name string
}

// Chat prompt sources reported in ChatPrompt.Source.
const (
	SourceGGUF    = "gguf"    // the file's tokenizer.chat_template
	SourceBuiltin = "builtin" // this package's format for the architecture
)

// ChatPrompt is a rendered conversation and how it was rendered.
type ChatPrompt struct {
	Text string
	// Source is SourceGGUF or SourceBuiltin.
	Source string
	// Format names the built-in format used ("chatml", "mistral",
	// "deepseek2", "olmoe"); empty for the file's template.
	Format string
	// TemplateErr says why the file's template was not used when it exists
	// but failed to parse or render (raise_exception included).
	TemplateErr error
}

// ChatTemplate returns the file's tokenizer.chat_template ("" if none).
func (t *Tokenizer) ChatTemplate() string { return t.chatTemplate }

// RenderChat renders msgs with the file's chat template (Jinja, rendered
// with Hugging Face's settings: trim_blocks and lstrip_blocks on, bos_token
// and eos_token defined, raise_exception available), or with a built-in
// format for the architecture when the file has no template or it fails.
// RenderChatPrompt tells which was used.
func (t *Tokenizer) RenderChat(msgs []Message, addGenerationPrompt bool) (string, error) {
	p, err := t.RenderChatPrompt(msgs, addGenerationPrompt)
	return p.Text, err
}

// RenderChatPrompt is RenderChat, also reporting which template rendered.
func (t *Tokenizer) RenderChatPrompt(msgs []Message, addGenerationPrompt bool) (ChatPrompt, error) {
	return t.RenderChatWith(msgs, ChatOptions{AddGenerationPrompt: addGenerationPrompt})
}

// RenderChatWith is RenderChatPrompt with tools and template variables. Only the file's
// template sees them: the built-in formats know no tools, so a caller that has tools for a
// model whose template does not write them (ChatCaps) describes them in a message itself.
func (t *Tokenizer) RenderChatWith(msgs []Message, o ChatOptions) (ChatPrompt, error) {
	addGenerationPrompt := o.AddGenerationPrompt
	var tmplErr error
	if t.chatTemplate != "" {
		text, err := t.renderTemplate(msgs, o, t.ChatCaps())
		if err == nil {
			return ChatPrompt{Text: text, Source: SourceGGUF}, nil
		}
		tmplErr = err
	}
	format, render := t.builtinFormat(o)
	if render == nil {
		if tmplErr != nil {
			return ChatPrompt{}, fmt.Errorf("tokenizer: %s failed (%w) and architecture %q has no built-in chat format", keyChatTemplate, tmplErr, t.arch)
		}
		return ChatPrompt{}, fmt.Errorf("tokenizer: no %s and architecture %q has no built-in chat format", keyChatTemplate, t.arch)
	}
	return ChatPrompt{Text: render(msgs, addGenerationPrompt), Source: SourceBuiltin, Format: format, TemplateErr: tmplErr}, nil
}

// EncodePrompt tokenizes a rendered chat prompt: special tokens written by
// the template are parsed, and BOS is added when the vocabulary wants one
// unless the template already wrote it (Mixtral's and DeepSeek's do), so a
// prompt never starts with two.
func (t *Tokenizer) EncodePrompt(prompt string) ([]int32, error) {
	addBOS := t.addBOS
	if bos, ok := t.BOS(); ok && strings.HasPrefix(prompt, t.tokens[bos]) {
		addBOS = false
	}
	ids, err := t.Encode(prompt, false, true)
	if err != nil || !addBOS {
		return ids, err
	}
	if t.bos == noToken {
		return nil, fmt.Errorf("tokenizer: add_bos_token is set but the vocabulary has no BOS token")
	}
	return append([]int32{t.bos}, ids...), nil
}

// tokenText is the text of a special token for templates ("" if none).
func (t *Tokenizer) tokenText(id int32) string {
	if id < 0 || int(id) >= len(t.tokens) {
		return ""
	}
	return t.tokens[id]
}

var (
	chatEnvOnce sync.Once
	chatEnv     *exec.Environment
	chatConfig  *config.Config
)

// environment is gonja's default environment plus the globals Hugging
// Face's apply_chat_template adds.
func environment() (*exec.Environment, *config.Config) {
	chatEnvOnce.Do(func() {
		ctx := exec.EmptyContext().Update(builtins.GlobalFunctions).Update(builtins.GlobalVariables)
		ctx.Set("raise_exception", func(msg string) (string, error) {
			return "", fmt.Errorf("raise_exception: %s", msg)
		})
		chatEnv = &exec.Environment{
			Context:           ctx,
			Filters:           hfFilters(),
			Tests:             builtins.Tests,
			ControlStructures: builtins.ControlStructures,
			Methods:           hfMethods(),
		}
		chatConfig = config.New()
		chatConfig.TrimBlocks = true
		chatConfig.LeftStripBlocks = true
	})
	return chatEnv, chatConfig
}

// renderTemplate renders the file's template. Templates are parsed per call:
// parsing is cheap next to a model's forward pass, and a parsed gonja
// template keeps state we do not want shared between goroutines.
func (t *Tokenizer) renderTemplate(msgs []Message, o ChatOptions, caps ChatCaps) (out string, err error) {
	return renderJinja(t.chatTemplate, msgs, o, caps, t.templateTokens())
}

// templateTokens are the special tokens a template may name.
func (t *Tokenizer) templateTokens() map[string]any {
	vars := map[string]any{"bos_token": t.tokenText(t.bos), "eos_token": t.tokenText(t.eos)}
	if t.unk != noToken {
		vars["unk_token"] = t.tokenText(t.unk)
	}
	return vars
}

func renderJinja(src string, msgs []Message, o ChatOptions, caps ChatCaps, tokens map[string]any) (out string, err error) {
	defer func() {
		// gonja is young; a template it mishandles must not take the
		// process down, only fall back to the built-in format.
		if r := recover(); r != nil {
			err = fmt.Errorf("template engine panic: %v", r)
		}
	}()
	env, cfg := environment()
	tpl, err := exec.NewTemplate(templateName, cfg, templateLoader{src}, env)
	if err != nil {
		return "", fmt.Errorf("parsing: %w", err)
	}
	messages := make(pyList, len(msgs))
	for i, m := range msgs {
		messages[i] = messageVars(m, caps)
	}
	now := o.Now
	if now.IsZero() {
		now = time.Now()
	}
	vars := map[string]any{"messages": messages, "add_generation_prompt": o.AddGenerationPrompt,
		"strftime_now": func(format string) string { return strftime(now, format) }}
	for k, v := range tokens {
		vars[k] = v
	}
	if err := toolTemplateVars(o, vars); err != nil {
		return "", err
	}
	return tpl.ExecuteToString(exec.NewContext(vars))
}

const templateName = "chat_template"

// templateLoader serves the chat template and nothing else: a template that
// came with a downloaded model must not read local files through
// {% include %} or {% import %}.
type templateLoader struct{ src string }

func (l templateLoader) Read(path string) (io.Reader, error) {
	if path != templateName {
		return nil, fmt.Errorf("chat templates may not load other templates (%q)", path)
	}
	return strings.NewReader(l.src), nil
}

func (l templateLoader) Resolve(path string) (string, error) { return path, nil }

func (l templateLoader) Inherit(string) (loaders.Loader, error) { return l, nil }

// builtinFormat picks the fallback format for general.architecture; o's date and tools go
// to the formats that write them (harmony).
func (t *Tokenizer) builtinFormat(o ChatOptions) (string, func([]Message, bool) string) {
	switch t.arch {
	case "gpt-oss":
		return "harmony", func(msgs []Message, gen bool) string { return renderHarmony(msgs, gen, o.Now, o.Tools) }
	case "llama", "mixtral":
		return "mistral", t.renderMistral
	case "qwen2", "qwen2moe", "qwen3", "qwen3moe", "qwen35moe":
		return "chatml", renderChatML
	case "deepseek2":
		return "deepseek2", t.renderDeepseek2
	case "olmoe":
		return "olmoe", t.renderOLMoE
	}
	return "", nil
}

// renderChatML is the Qwen format.
func renderChatML(msgs []Message, gen bool) string {
	var b strings.Builder
	for _, m := range msgs {
		b.WriteString("<|im_start|>" + m.Role + "\n" + m.Content + "<|im_end|>\n")
	}
	if gen {
		b.WriteString("<|im_start|>assistant\n")
	}
	return b.String()
}

// renderMistral follows Mixtral-8x7B-Instruct's template: a system message
// is folded into the first user turn; the prompt always ends after
// "[/INST]", so there is no separate generation prompt.
func (t *Tokenizer) renderMistral(msgs []Message, _ bool) string {
	var b strings.Builder
	b.WriteString(t.tokenText(t.bos))
	system := ""
	if len(msgs) > 0 && msgs[0].Role == "system" {
		system, msgs = msgs[0].Content, msgs[1:]
	}
	for i, m := range msgs {
		switch m.Role {
		case "assistant":
			b.WriteString(" " + m.Content + t.tokenText(t.eos))
		default:
			content := m.Content
			if i == 0 && system != "" {
				content = system + "\n\n" + content
			}
			b.WriteString(" [INST] " + content + " [/INST]")
		}
	}
	return b.String()
}

// renderDeepseek2 follows DeepSeek-V2-Lite-Chat's template.
func (t *Tokenizer) renderDeepseek2(msgs []Message, gen bool) string {
	var b strings.Builder
	b.WriteString(t.tokenText(t.bos))
	for _, m := range msgs {
		switch m.Role {
		case "system":
			b.WriteString(m.Content + "\n\n")
		case "assistant":
			b.WriteString("Assistant: " + m.Content + t.tokenText(t.eos))
		default:
			b.WriteString("User: " + m.Content + "\n\n")
		}
	}
	if gen {
		b.WriteString("Assistant:")
	}
	return b.String()
}

// renderOLMoE follows OLMoE-1B-7B-Instruct's (Tülu) template, without
// its leading bos_token: OLMoE does not use one.
func (t *Tokenizer) renderOLMoE(msgs []Message, gen bool) string {
	var b strings.Builder
	for _, m := range msgs {
		switch m.Role {
		case "system":
			b.WriteString("<|system|>\n" + m.Content + "\n")
		case "assistant":
			b.WriteString("<|assistant|>\n" + m.Content + t.tokenText(t.eos) + "\n")
		default:
			b.WriteString("<|user|>\n" + m.Content + "\n")
		}
	}
	if gen {
		b.WriteString("<|assistant|>\n")
	}
	return b.String()
}

// strftime formats t with the C directives templates use (Llama 3's
// strftime_now("%d %b %Y")); unknown directives are kept as written.
func strftime(t time.Time, format string) string {
	var b strings.Builder
	for i := 0; i < len(format); i++ {
		if format[i] != '%' || i+1 == len(format) {
			b.WriteByte(format[i])
			continue
		}
		i++
		switch format[i] {
		case 'Y':
			b.WriteString(t.Format("2006"))
		case 'y':
			b.WriteString(t.Format("06"))
		case 'm':
			b.WriteString(t.Format("01"))
		case 'd':
			b.WriteString(t.Format("02"))
		case 'e':
			b.WriteString(t.Format("_2"))
		case 'B':
			b.WriteString(t.Format("January"))
		case 'b', 'h':
			b.WriteString(t.Format("Jan"))
		case 'A':
			b.WriteString(t.Format("Monday"))
		case 'a':
			b.WriteString(t.Format("Mon"))
		case 'H':
			b.WriteString(t.Format("15"))
		case 'I':
			b.WriteString(t.Format("03"))
		case 'M':
			b.WriteString(t.Format("04"))
		case 'S':
			b.WriteString(t.Format("05"))
		case 'p':
			b.WriteString(t.Format("PM"))
		case 'j':
			fmt.Fprintf(&b, "%03d", t.YearDay())
		case '%':
			b.WriteByte('%')
		default:
			b.WriteByte('%')
			b.WriteByte(format[i])
		}
	}
	return b.String()
}
