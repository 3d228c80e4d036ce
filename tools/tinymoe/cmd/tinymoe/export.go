package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/commit-run/commit-run/quant"
	"github.com/commit-run/commit-run/tools/tinymoe"
)

func export(args []string) error {
	fs := flag.NewFlagSet("export", flag.ExitOnError)
	config := fs.String("config", "", "variant config (tools/tinymoe/configs/*.json)")
	weights := fs.String("weights", "", "trained weights written by train.py (.safetensors)")
	prep := fs.String("prep", "tools/tinymoe/work", "directory written by prep (for the vocabulary)")
	typ := fs.String("type", "f16", "weight type: f16 or q8_0")
	out := fs.String("out", "", "output GGUF file")
	fs.Parse(args)
	if *config == "" || *weights == "" || *out == "" {
		return fmt.Errorf("export: -config, -weights and -out are required")
	}
	c, err := tinymoe.LoadConfig(*config)
	if err != nil {
		return err
	}
	v, err := tinymoe.LoadVocab(filepath.Join(*prep, tinymoe.FileVocab))
	if err != nil {
		return err
	}
	w, err := tinymoe.ReadSafetensors(*weights)
	if err != nil {
		return err
	}
	var t quant.Type
	switch *typ {
	case "f16":
		t = quant.F16
	case "q8_0":
		t = quant.Q8_0
	default:
		return fmt.Errorf("export: -type %q: want f16 or q8_0", *typ)
	}
	sum, err := tinymoe.Export(c, v, w, t, *out)
	if err != nil {
		return err
	}
	st, err := os.Stat(*out)
	if err != nil {
		return err
	}
	fmt.Printf("%s: %.2f MB, sha256 %s (trained %s steps)\n", *out, float64(st.Size())/1e6, sum, w.Metadata["step"])
	return nil
}
