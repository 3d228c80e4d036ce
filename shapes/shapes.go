// Package shapes opens the public model shapes (Mixtral-8x7B, Qwen3-30B-A3B, ...; DESIGN.md
// §7) as engine models whose weights are never read: each real model's metadata and tensors,
// as synth builds them, over address space that nothing backs, for timing-only runs on a
// simulated GPU (bench --shape).
package shapes

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

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
	return models.NewVirtualFile("shape:"+spec.Name, b.KV, ts)
}
