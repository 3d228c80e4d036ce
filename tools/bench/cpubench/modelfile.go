package main

import (
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"

	"github.com/commit-run/commit-run/synth"
)

// headerBytes bounds a synthetic file's metadata and tensor alignment padding, which
// synth.Model.Bytes leaves out: mostly the vocabulary, about 25 bytes a token as synth writes
// it (3.85 MB for Qwen3's 151936 tokens, 1.26 MB for OLMoE's 50304), so 64 a token and a MiB
// bound it with room to spare.
func headerBytes(s synth.Spec) int64 { return 64*int64(s.Vocab) + 1<<20 }

// maxLayers caps the automatic layer count: the real models have 16 (OLMoE) and 48 (Qwen3).
const maxLayers = 64

// benchSpec is the synth spec of shape sh in type t with the given layers.
func benchSpec(sh shape, t wtype, layers int, seed uint64) (synth.Spec, error) {
	r, err := synth.RecipeByName(t.Recipe)
	if err != nil {
		return synth.Spec{}, err
	}
	o := sh.Opts
	o.Layers, o.Types, o.Seed = layers, r, seed
	return synth.Bench(sh.Arch, o)
}

// estimateBytes is at least the size a file of spec s will have, and at most a few MB more.
func estimateBytes(s synth.Spec) (int64, error) {
	m, err := synth.Build(s)
	if err != nil {
		return 0, err
	}
	return m.Bytes() + headerBytes(s), nil
}

// chooseLayers returns the most layers (at least 1) whose file stays under limit bytes: the
// more layers, the closer the share of expert and attention weights in a token's reads comes
// to the real model's, where the embedding and the output head are a small part.
func chooseLayers(sh shape, t wtype, limit int64, seed uint64) (int, int64, error) {
	best, bestBytes := 0, int64(0)
	for l := 1; l <= maxLayers; l++ {
		s, err := benchSpec(sh, t, l, seed)
		if err != nil {
			return 0, 0, err
		}
		n, err := estimateBytes(s)
		if err != nil {
			return 0, 0, err
		}
		if n >= limit && l > 1 {
			break
		}
		best, bestBytes = l, n
		if n >= limit {
			break // even one layer is over: use it, the caller warns
		}
	}
	return best, bestBytes, nil
}

// modelPath is where the file of spec s (shape sh, type t, the given layers and seed) lives in
// the work folder. The name holds everything that defines its contents, the tensors' types
// included (a digest of their names, types and shapes, which a recipe's rules decide), so a
// cached file is reused only when it is the same model.
func modelPath(work string, sh shape, t wtype, layers int, seed uint64, s synth.Spec) (string, error) {
	m, err := synth.Build(s)
	if err != nil {
		return "", err
	}
	h := fnv.New32a()
	for _, ten := range m.Tensors {
		fmt.Fprintf(h, "%s %v %v\n", ten.Name, ten.Type, ten.Shape)
	}
	return filepath.Join(work, fmt.Sprintf("%s-%s-%dL-s%d-%08x.gguf", sh.Name, t.Recipe, layers, seed, h.Sum32())), nil
}

// ensureModel writes the model unless a finished file is already there (regen forces it). It
// writes to a temporary name and renames, so an interrupted run never leaves a partial file
// that a later run would take for a finished one.
func ensureModel(path string, s synth.Spec, regen bool, logf func(string, ...any)) error {
	if !regen {
		if st, err := os.Stat(path); err == nil && st.Mode().IsRegular() {
			return nil
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("work folder for %s: %w", path, err)
	}
	m, err := synth.Build(s)
	if err != nil {
		return err
	}
	logf("generating %s (%.2f GB of tensor data; minutes for the largest files)", path, float64(m.Bytes())/1e9)
	tmp := path + ".partial"
	if _, err := m.Write(tmp); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("finish %s: %w", path, err)
	}
	return nil
}
