package main

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/commit-run/commit-run/models"
	"github.com/commit-run/commit-run/tools/tinymoe"
)

// manifestEntry is what tools/golden/ref/golden.mjs reads for each model.
type manifestEntry struct {
	Name    string    `json:"name"`
	File    string    `json:"file"`  // relative to the manifest
	Model   string    `json:"model"` // repository path, recorded in the fixture
	SHA256  string    `json:"sha256"`
	Arch    string    `json:"arch"`
	Types   string    `json:"types"`
	Prompts [][]int32 `json:"prompts"`
}

// Prompts for the golden fixtures are passages of the held-out text, so that the greedy
// continuation shows the model on text it never trained on.
const (
	promptTokens     = 64
	promptCandidates = 4
)

func manifest(args []string) error {
	fs := flag.NewFlagSet("manifest", flag.ExitOnError)
	prep := fs.String("prep", "tools/tinymoe/work", "directory written by prep (for the held-out ids)")
	out := fs.String("out", "tools/tinymoe/work/manifest.json", "manifest to write")
	fs.Parse(args)
	if fs.NArg() == 0 {
		return fmt.Errorf("manifest: name the model files (repository paths)")
	}
	raw, err := os.ReadFile(filepath.Join(*prep, tinymoe.FileHeldIDs))
	if err != nil {
		return fmt.Errorf("manifest: %w", err)
	}
	held := make([]int32, len(raw)/2)
	for i := range held {
		held[i] = int32(binary.LittleEndian.Uint16(raw[2*i:]))
	}
	if len(held) < promptCandidates*promptTokens*4 {
		return fmt.Errorf("manifest: %d held-out tokens are too few", len(held))
	}
	var prompts [][]int32
	for i := 0; i < promptCandidates; i++ {
		at := (i + 1) * len(held) / (promptCandidates + 1)
		prompts = append(prompts, held[at:at+promptTokens])
	}
	outDir, err := filepath.Abs(filepath.Dir(*out))
	if err != nil {
		return err
	}
	var entries []manifestEntry
	for _, path := range fs.Args() {
		b, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("manifest: %w", err)
		}
		f, err := models.Open(path)
		if err != nil {
			return fmt.Errorf("manifest: %w", err)
		}
		arch := f.KV.Architecture()
		types := map[uint32]string{0: "f32", 1: "f16", 7: "q8_0"}[f.KV.Uint("general.file_type")]
		f.Close()
		if types == "" {
			return fmt.Errorf("manifest: %s is neither F32, F16 nor Q8_0", path)
		}
		abs, err := filepath.Abs(path)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(outDir, abs)
		if err != nil {
			return err
		}
		name := strings.TrimSuffix(filepath.Base(path), ".gguf")
		sum := sha256.Sum256(b)
		entries = append(entries, manifestEntry{Name: name, File: filepath.ToSlash(rel), Model: filepath.ToSlash(path),
			SHA256: hex.EncodeToString(sum[:]), Arch: arch, Types: types, Prompts: prompts})
	}
	j, err := json.MarshalIndent(entries, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(*out, j, 0o644)
}
