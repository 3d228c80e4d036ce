// Command synth writes synthetic GGUF models (see package synth).
//
// The golden set, with a manifest of names, hashes and prompts for tools/golden/ref:
//
//	synth -golden -dir DIR
//
// One golden model:
//
//	synth -name mixtral-q4km -out FILE
//
// A benchmark model of a given shape (real shape of the architecture unless overridden):
//
//	synth -arch olmoe -embd 2048 -experts 64 -topk 8 -ffn 1024 -layers 4 -type q8_0 -out FILE
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/commit-run/commit-run/synth"
)

// ManifestEntry describes one written golden model for the reference runner.
type ManifestEntry struct {
	Name   string `json:"name"`
	File   string `json:"file"` // relative to the manifest
	SHA256 string `json:"sha256"`
	Arch   string `json:"arch"`
	Types  string `json:"types"`
	Bytes  int64  `json:"bytes"`
	// Prompts are candidates; the reference runner picks one (see synth.Prompts).
	Prompts [][]int32 `json:"prompts"`
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "synth:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		golden = flag.Bool("golden", false, "write every golden model and manifest.json into -dir")
		dir    = flag.String("dir", "", "output folder for -golden")
		only   = flag.String("only", "", "with -golden: comma-separated model names to write (default all)")
		name   = flag.String("name", "", "write the golden model of this name to -out")
		list   = flag.Bool("list", false, "list the golden models and their tensor types")
		out    = flag.String("out", "", "output file")
	)
	var b benchFlags
	b.register()
	flag.Parse()

	switch {
	case *list:
		return listGolden()
	case *golden:
		if *dir == "" {
			return fmt.Errorf("-golden needs -dir")
		}
		return writeGolden(*dir, *only)
	case *name != "":
		if *out == "" {
			return fmt.Errorf("-name needs -out")
		}
		return writeNamed(*name, *out)
	case b.arch != "":
		if *out == "" {
			return fmt.Errorf("-arch needs -out")
		}
		return writeBench(b, *out)
	}
	flag.Usage()
	return fmt.Errorf("nothing to do: give -golden, -name, -list or -arch")
}

// benchFlags are the flags of a benchmark model (-arch): its shape, where 0 keeps the real
// model's size, its tensor types and its seed.
type benchFlags struct {
	arch, typ                                                      string
	layers, embd, heads, kvheads, experts, topk, ffn, dense, vocab int
	seed                                                           uint64
}

// register defines the -arch flags into b, so that writeBench takes them as one value.
func (b *benchFlags) register() {
	flag.StringVar(&b.arch, "arch", "", "benchmark model: architecture (llama, mixtral, qwen2moe, qwen3moe, olmoe, deepseek2, qwen2, qwen3)")
	flag.IntVar(&b.layers, "layers", 0, "layers (0 = the real model's)")
	flag.IntVar(&b.embd, "embd", 0, "embedding width")
	flag.IntVar(&b.heads, "heads", 0, "attention heads")
	flag.IntVar(&b.kvheads, "kvheads", 0, "KV heads")
	flag.IntVar(&b.experts, "experts", 0, "routed experts (llama: -1 = dense Llama-2)")
	flag.IntVar(&b.topk, "topk", 0, "experts used per token")
	flag.IntVar(&b.ffn, "ffn", 0, "routed expert width (dense models: FFN width)")
	flag.IntVar(&b.dense, "dense-ffn", 0, "dense FFN width of DeepSeek's leading layers")
	flag.IntVar(&b.vocab, "vocab", 0, "vocabulary size")
	flag.StringVar(&b.typ, "type", "q8_0", "type recipe: f32 f16 bf16 q8_0 q4km q5km q3km q2k q4_0 q4_0-preset q5_1 iq4_nl, or a single type (q4_k, q6_k, ...)")
	flag.Uint64Var(&b.seed, "seed", 1, "random seed")
}

// writeNamed writes the golden model name to out and prints its hash the way sha256sum does,
// so that a script can check the file against the manifest.
func writeNamed(name, out string) error {
	s, err := synth.GoldenSpec(name)
	if err != nil {
		return err
	}
	sum, err := synth.WriteFile(s, out)
	if err != nil {
		return err
	}
	fmt.Printf("%s  %s\n", sum, out)
	return nil
}

// writeBench writes the benchmark model b describes to out. -ffn is the width of the FFNs the
// model mostly has: a dense model's FFN, else the routed experts' (with -dense-ffn for
// DeepSeek's leading dense layers).
func writeBench(b benchFlags, out string) error {
	r, err := synth.RecipeByName(b.typ)
	if err != nil {
		return err
	}
	a := b.arch
	if a == "mixtral" {
		a = synth.ArchLlama
	}
	o := synth.BenchOptions{Layers: b.layers, Embd: b.embd, Heads: b.heads, HeadsKV: b.kvheads,
		Experts: b.experts, ExpertsUsed: b.topk, Vocab: b.vocab, Seed: b.seed, Types: r}
	if (a == synth.ArchLlama && b.experts < 0) || a == synth.ArchQwen2 || a == synth.ArchQwen3 {
		o.FFN = b.ffn
	} else {
		o.ExpertFFN = b.ffn
		o.FFN = b.dense
	}
	s, err := synth.Bench(a, o)
	if err != nil {
		return err
	}
	m, err := synth.Build(s)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "writing %s: %.2f GB of tensor data\n", s.Name, float64(m.Bytes())/1e9)
	sum, err := m.Write(out)
	if err != nil {
		return err
	}
	fmt.Printf("%s  %s\n", sum, out)
	return nil
}

// promptCandidates is how many prompts the manifest offers the reference runner per model.
const promptCandidates = 16

func writeGolden(dir, only string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	want := map[string]bool{}
	for _, n := range strings.Split(only, ",") {
		if n != "" {
			want[n] = true
		}
	}
	var manifest []ManifestEntry
	for _, s := range synth.Golden() {
		if len(want) > 0 && !want[s.Name] {
			continue
		}
		m, err := synth.Build(s)
		if err != nil {
			return err
		}
		file := s.Name + ".gguf"
		sum, err := m.Write(filepath.Join(dir, file))
		if err != nil {
			return err
		}
		st, err := os.Stat(filepath.Join(dir, file))
		if err != nil {
			return fmt.Errorf("stat %s: %w", file, err)
		}
		prompts, err := synth.Prompts(s, promptCandidates)
		if err != nil {
			return err
		}
		manifest = append(manifest, ManifestEntry{Name: s.Name, File: file, SHA256: sum, Arch: s.Arch,
			Types: s.Types.Name, Bytes: st.Size(), Prompts: prompts})
		fmt.Printf("%-24s %8.2f MB  %s\n", s.Name, float64(st.Size())/1e6, sum)
	}
	b, err := json.MarshalIndent(manifest, "", "  ")
	if err != nil {
		return fmt.Errorf("encode manifest: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "manifest.json"), append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write manifest: %w", err)
	}
	return nil
}

func listGolden() error {
	for _, s := range synth.Golden() {
		m, err := synth.Build(s)
		if err != nil {
			return err
		}
		counts := map[string]int{}
		var order []string
		for _, t := range m.Tensors {
			k := t.Type.String()
			if counts[k] == 0 {
				order = append(order, k)
			}
			counts[k]++
		}
		var parts []string
		for _, k := range order {
			parts = append(parts, fmt.Sprintf("%s:%d", k, counts[k]))
		}
		fmt.Printf("%-24s %-9s %7.2f MB  %s\n", s.Name, s.Arch, float64(m.Bytes())/1e6, strings.Join(parts, " "))
	}
	return nil
}
