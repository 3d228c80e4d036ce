package tinymoe

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/ollama/ollama/fs/ggml"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/quant"
	"github.com/commit-run/commit-run/synth"
)

// ChatTemplate makes a conversation a scene of the novel: the user's lines and the model's
// replies are quoted speech, each its own paragraph, and the generation prompt opens the
// model's quote, so the model answers in the book's dialogue. A reply ends at its paragraph's
// end (ChatStop): the models never saw their EOS token and would otherwise write on until the
// context is full. The prompt ends in a quote rather than the blank line itself because a
// text-final "\n\n" is pre-tokenized differently from one followed by a word, which the
// models never saw before a paragraph.
const (
	ChatTemplate = "{%- for message in messages -%}" +
		"{%- if message['role'] == 'system' -%}{{ message['content'] | trim }}" +
		"{%- elif message['role'] == 'assistant' -%}\"{{ message['content'] | trim }}" +
		"{%- else -%}\"{{ message['content'] | trim }}\"" +
		"{%- endif -%}{{ '\\n\\n' }}{%- endfor -%}" +
		"{%- if add_generation_prompt -%}\"{%- endif -%}"
	ChatStop = "\n\n"
)

// Export writes the trained weights w of the variant c as GGUF with vocabulary v, every weight
// matrix in type t (F16 or Q8_0; norms, biases and routers stay F32 as llama.cpp keeps them),
// and returns the file's SHA-256.
func Export(c *Config, v *Vocab, w *Weights, t quant.Type, path string) (string, error) {
	var recipe synth.Recipe
	switch t {
	case quant.F16:
		recipe = synth.F16
	case quant.Q8_0:
		recipe = synth.Q8_0
	default:
		return "", fmt.Errorf("export: type %v: want F16 or Q8_0", t)
	}
	m, err := synth.Build(c.Spec(len(v.Tokens), recipe))
	if err != nil {
		return "", fmt.Errorf("export: %w", err)
	}
	kv := ggml.KV{}
	for k, val := range m.KV {
		if !strings.HasPrefix(k, "tokenizer.") {
			kv[k] = val
		}
	}
	for k, val := range v.KV() {
		kv[k] = val
	}
	kv["general.name"] = c.Name
	kv["general.description"] = "A tiny MoE trained on the first 90% of War and Peace by tools/tinymoe; a yardstick for expert-selection changes, not a chat model."
	kv["tokenizer.chat_template"] = ChatTemplate
	kv[engine.KeyChatStop] = []string{ChatStop}

	used := map[string]bool{}
	ts := make([]*ggml.Tensor, len(m.Tensors))
	for i, mt := range m.Tensors {
		data, ok := w.Data[mt.Name]
		if !ok {
			return "", fmt.Errorf("export: the weights lack %s", mt.Name)
		}
		want := make([]int, len(mt.Shape))
		for j, d := range mt.Shape {
			want[len(want)-1-j] = int(d) // ggml lists the innermost dimension first
		}
		if !slices.Equal(w.Shapes[mt.Name], want) {
			return "", fmt.Errorf("export: %s has shape %v, the %s layout needs %v", mt.Name, w.Shapes[mt.Name], c.Arch, want)
		}
		used[mt.Name] = true
		ts[i] = &ggml.Tensor{Name: mt.Name, Kind: uint32(mt.Type), Shape: mt.Shape,
			WriterTo: rowsWriter{t: mt.Type, ne0: int(mt.Shape[0]), data: data}}
	}
	for _, n := range w.Names() {
		if !used[n] {
			return "", fmt.Errorf("export: the weights hold %s, which the %s layout has no place for", n, c.Arch)
		}
	}

	f, err := os.Create(path)
	if err != nil {
		return "", fmt.Errorf("export: %w", err)
	}
	defer f.Close()
	if err := ggml.WriteGGUF(f, kv, ts); err != nil {
		return "", fmt.Errorf("export %s: %w", path, err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return "", err
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), f.Close()
}

// rowsWriter encodes a tensor's rows in its ggml type.
type rowsWriter struct {
	t    quant.Type
	ne0  int
	data []float32
}

func (r rowsWriter) WriteTo(w io.Writer) (int64, error) {
	rb, err := r.t.RowBytes(r.ne0)
	if err != nil {
		return 0, err
	}
	rows := len(r.data) / r.ne0
	buf := make([]byte, rows*rb)
	for i := 0; i < rows; i++ {
		quant.QuantizeRow(r.t, r.data[i*r.ne0:(i+1)*r.ne0], buf[i*rb:(i+1)*rb])
	}
	n, err := w.Write(buf)
	return int64(n), err
}
