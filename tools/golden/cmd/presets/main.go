// Command presets records the types llama.cpp's own quantizer gives every tensor of the
// public shapes under its Q4_K_M preset, for synth's test that its Q4KM recipe gives the same
// (synth/testdata/q4km-llamacpp.json; TestQ4KMIsLlamaCpps).
//
// Each shape is written by synth as an F32 file with its real layers, layout and expert
// count (exactly 8, or not: the only thing about experts the preset reads) but small
// matrices, then quantized by llama_model_quantize, from node-llama-cpp's prebuilt libllama
// (tools/golden/ref, the llama.cpp of the goldens) through a small C program
// (tools/golden/presets/quantize.c) built against the headers of the same release.
//
//	go run ./tools/golden/cmd/presets [-src ../shared/gpu/llama.cpp-v0.5.0-slim.tar.xz]
//
// Needs gcc, tar and node-llama-cpp's linux-x64 build (tools/golden/regen.sh installs it).
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/commit-run/commit-run/models"
	"github.com/commit-run/commit-run/synth"
)

// Small is a shape's size for the check: what synth.BenchOptions overrides.
type Small struct {
	Embd, Heads, HeadsKV, Experts, ExpertsUsed, FFN, ExpertFFN, Vocab int
}

// Shape is one shape's record: its name, its size, and llama.cpp's type of every tensor.
type Shape struct {
	Shape string
	Small Small
	Types map[string]string
}

// Record is the file the command writes.
type Record struct {
	Preset   string // the preset, as llama-quantize names it
	FileType int    // its llama_ftype
	LlamaCpp string // where the quantizer came from
	Shapes   []Shape
}

// shapes are the public shapes with their K-quant files, and two dense models, one of them
// with tied embeddings.
var shapes = []string{"mixtral-8x7b", "qwen1.5-moe-a2.7b", "qwen3-30b-a3b", "olmoe-1b-7b", "deepseek-v2-lite",
	"glm-4.5-air", "gpt-oss-20b", "qwen3.6-35b-a3b", "qwen2-1.5b", "qwen3-1.7b"}

func main() {
	src := flag.String("src", "../shared/gpu/llama.cpp-v0.5.0-slim.tar.xz", "llama.cpp's source of node-llama-cpp's release, for its headers")
	lib := flag.String("lib", "tools/golden/ref/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64", "node-llama-cpp's prebuilt libraries")
	out := flag.String("out", "synth/testdata/q4km-llamacpp.json", "the record to write")
	flag.Parse()
	log.SetFlags(0)
	if err := run(*src, *lib, *out); err != nil {
		log.Fatal("presets: ", err)
	}
}

func run(src, lib, out string) error {
	work, err := os.MkdirTemp("", "presets")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	bin, err := buildQuantizer(src, lib, work)
	if err != nil {
		return err
	}
	rec := Record{Preset: "Q4_K_M", FileType: 15, LlamaCpp: "node-llama-cpp's prebuilt libllama (" + filepath.Base(src) + ")"}
	for _, name := range shapes {
		sh, err := quantizeShape(bin, work, name)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		rec.Shapes = append(rec.Shapes, sh)
		log.Printf("%s: %d tensors", name, len(sh.Types))
	}
	b, err := json.MarshalIndent(rec, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(out, append(b, '\n'), 0o644)
}

// buildQuantizer compiles quantize.c against the release's headers and libllama.
func buildQuantizer(src, lib, work string) (string, error) {
	lib, err := filepath.Abs(lib)
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(filepath.Join(lib, "libllama.v0.5.0.so")); err != nil {
		return "", fmt.Errorf("node-llama-cpp's libllama: %w (run tools/golden/regen.sh once to install it)", err)
	}
	tar := exec.Command("tar", "xJf", src, "-C", work, "./include", "./ggml/include")
	if b, err := tar.CombinedOutput(); err != nil {
		return "", fmt.Errorf("headers from %s: %v: %s", src, err, b)
	}
	bin := filepath.Join(work, "quantize")
	cc := exec.Command("gcc", "-O1", "-I", filepath.Join(work, "include"), "-I", filepath.Join(work, "ggml/include"),
		"-o", bin, "tools/golden/presets/quantize.c", "-L", lib, "-l:libllama.v0.5.0.so", "-Wl,-rpath,"+lib)
	if b, err := cc.CombinedOutput(); err != nil {
		return "", fmt.Errorf("gcc: %v: %s", err, b)
	}
	return bin, nil
}

// quantizeShape writes shape name small in F32, quantizes it with Q4_K_M and reads the types
// back.
func quantizeShape(bin, work, name string) (Shape, error) {
	small := smallOf(name)
	s, err := synth.BenchShape(name, small.Options(synth.F32))
	if err != nil {
		return Shape{}, err
	}
	in, q := filepath.Join(work, name+"-f32.gguf"), filepath.Join(work, name+"-q4km.gguf")
	defer os.Remove(in)
	defer os.Remove(q)
	if _, err := synth.WriteFile(s, in); err != nil {
		return Shape{}, err
	}
	cmd := exec.Command(bin, in, q, "15")
	if b, err := cmd.CombinedOutput(); err != nil {
		return Shape{}, fmt.Errorf("%v: %s", err, b)
	}
	f, err := models.Open(q)
	if err != nil {
		return Shape{}, err
	}
	defer f.Close()
	sh := Shape{Shape: name, Small: small, Types: map[string]string{}}
	for _, t := range f.Tensors {
		sh.Types[t.Name] = t.Type.String()
	}
	return sh, nil
}

// smallOf sizes a shape for the check: matrices of 256 (so that no K-quant falls back), two
// heads, and 8 experts where the shape has 8, else 4.
func smallOf(name string) Small {
	s, err := synth.BenchShape(name, synth.BenchOptions{})
	if err != nil {
		log.Fatal(err)
	}
	sm := Small{Embd: 256, Heads: 2, FFN: 256, ExpertFFN: 256, Vocab: 512}
	if s.HeadsKV != 0 {
		sm.HeadsKV = 1
	}
	if s.Experts > 0 {
		sm.Experts, sm.ExpertsUsed = 4, 2
		if s.Experts == 8 {
			sm.Experts = 8
		}
	}
	return sm
}

// Options are the benchmark options of the small shape, with the given types.
func (s Small) Options(r synth.Recipe) synth.BenchOptions {
	return synth.BenchOptions{Embd: s.Embd, Heads: s.Heads, HeadsKV: s.HeadsKV, Experts: s.Experts, ExpertsUsed: s.ExpertsUsed,
		FFN: s.FFN, ExpertFFN: s.ExpertFFN, Vocab: s.Vocab, Types: r}
}
