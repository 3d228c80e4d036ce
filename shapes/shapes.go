// Package shapes opens the public model shapes (Mixtral-8x7B, Qwen3-30B-A3B, ...; DESIGN.md
// §7) as engine models whose weights are never read: each real model's metadata and tensors,
// as synth builds them, over address space that nothing backs, for timing-only runs on a
// simulated GPU (bench --shape).
package shapes

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"os"
	"reflect"
	"slices"
	"strings"

	"github.com/ollama/ollama/fs/ggml"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/models"
	"github.com/commit-run/commit-run/synth"
)

// shapeNames are the public shapes Open knows (DESIGN.md §7): synth's real shapes of these
// names.
var shapeNames = []string{"deepseek-v2-lite", "glm-4.5-air", "gpt-oss-120b", "gpt-oss-20b", "mixtral-8x7b",
	"olmoe-1b-7b", "qwen1.5-moe-a2.7b", "qwen3-30b-a3b", "qwen3.6-35b-a3b"}

// shapeSpec is synth's spec of a public shape NAME[@TYPE], named NAME@TYPE.
func shapeSpec(name string) (synth.Spec, error) {
	base, typ, _ := strings.Cut(strings.ToLower(strings.TrimSpace(name)), "@")
	if !slices.Contains(shapeNames, base) {
		return synth.Spec{}, fmt.Errorf("unknown model shape %q: known are %s", base, strings.Join(Names(), ", "))
	}
	recipe, err := synth.RecipeByName(cmp.Or(typ, defaultShapeType))
	if err != nil {
		return synth.Spec{}, fmt.Errorf("shape %s: %w", name, err)
	}
	spec, err := synth.BenchShape(base, synth.BenchOptions{Types: recipe})
	if err != nil {
		return synth.Spec{}, fmt.Errorf("shape %s: %w", name, err)
	}
	spec.Name = base + "@" + recipe.Name
	return spec, nil
}

// defaultShapeType is the quantization of a shape named without one: every weight Q4_K (with
// llama.cpp's fallback where a row does not divide into its blocks).
const defaultShapeType = "q4_k"

// Names lists the public model shapes Open knows.
func Names() []string {
	return slices.Clone(shapeNames)
}

// Open opens a public model shape, NAME[@TYPE], as a model whose weights are never read:
// its metadata and tensors as the model's GGUF file has them (synth's), over address space
// that nothing backs, so that shapes far larger than this machine open at once. TYPE is a
// quantization, a llama.cpp-like mix (q4km, q8_0, ...) or one ggml type for every weight
// (q4_k, q6_k, ...; the default is q4_k). A shape computes nothing: opts must make its runs
// timing only (Options.TimingOnly), with the routing given.
func Open(name string, opts engine.Options) (*engine.Model, error) {
	spec, err := shapeSpec(name)
	if err != nil {
		return nil, err
	}
	if opts.TimingOnly == nil {
		return nil, fmt.Errorf("shape %s has no weights: it runs timing only, on a simulated GPU with the routing given (Options.TimingOnly)", name)
	}
	f, err := shapeFile(spec)
	if err != nil {
		return nil, err
	}
	return engine.OpenFile(f, opts)
}

// Inspect describes a public model shape as engine.Inspect describes a file; its Path is
// "shape:NAME@TYPE".
func Inspect(name string) (*engine.Info, error) {
	spec, err := shapeSpec(name)
	if err != nil {
		return nil, err
	}
	f, err := shapeFile(spec)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return engine.InspectFile(f)
}

// shapeFile is the virtual file of a public shape.
func shapeFile(spec synth.Spec) (*models.File, error) {
	b, err := synth.Build(spec)
	if err != nil {
		return nil, fmt.Errorf("shape %s: %w", spec.Name, err)
	}
	ts := make([]models.TensorInfo, len(b.Tensors))
	for i, t := range b.Tensors {
		ts[i] = models.TensorInfo{Name: t.Name, Type: t.Type, Shape: t.Shape}
	}
	kv, err := decodedArrays(b.KV)
	if err != nil {
		return nil, fmt.Errorf("shape %s: %w", spec.Name, err)
	}
	return models.NewVirtualFile("shape:"+spec.Name, kv, ts)
}

// decodedArrays returns kv with its arrays outside the tokenizer (qwen35moe's
// rope.dimension_sections, ...) as a GGUF file's decoding gives them, which is the only form
// the loader's accessors read: synth's metadata holds Go slices, which they take for absent
// keys. It writes those keys to a small GGUF file and decodes it. The tokenizer's arrays stay
// as they are, since a shape runs no tokenizer.
func decodedArrays(kv ggml.KV) (ggml.KV, error) {
	arrays := ggml.KV{"general.architecture": kv.Architecture()}
	for k, v := range kv {
		if !strings.HasPrefix(k, "tokenizer.") && v != nil && reflect.TypeOf(v).Kind() == reflect.Slice {
			arrays[k] = v
		}
	}
	if len(arrays) == 1 {
		return kv, nil
	}
	f, err := os.CreateTemp("", "commit-run-shape-*.gguf")
	if err != nil {
		return nil, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	if err := ggml.WriteGGUF(f, arrays, nil); err != nil {
		return nil, fmt.Errorf("encode metadata arrays: %w", err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	g, err := ggml.Decode(f, -1)
	if err != nil {
		return nil, fmt.Errorf("decode metadata arrays: %w", err)
	}
	out := maps.Clone(kv)
	for k := range arrays {
		if v, ok := g.KV()[k]; ok {
			out[k] = v
		} else if k != "general.architecture" {
			return nil, fmt.Errorf("metadata key %q did not survive encoding", k)
		}
	}
	return out, nil
}
