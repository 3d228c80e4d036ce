// Command tinymoe prepares the training data of the bundled MoE models and exports trained
// weights to GGUF. See tools/tinymoe/README.md for the whole recipe.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"

	"github.com/commit-run/commit-run/tools/tinymoe"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "prep":
		err = prep(os.Args[2:])
	case "export":
		err = export(os.Args[2:])
	case "manifest":
		err = manifest(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "tinymoe:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: tinymoe prep [-text FILE] [-vocab N] [-out DIR]\n       tinymoe export -config FILE -weights FILE [-prep DIR] [-type f16|q8_0] -out FILE.gguf\n       tinymoe manifest [-prep DIR] [-out FILE] MODEL.gguf...")
	os.Exit(2)
}

func prep(args []string) error {
	fs := flag.NewFlagSet("prep", flag.ExitOnError)
	text := fs.String("text", "", "training text (default: War and Peace from the ollama module)")
	vocab := fs.Int("vocab", 2048, "vocabulary size, counting the 256 byte tokens and <|endoftext|>")
	out := fs.String("out", "tools/tinymoe/work", "output directory")
	fs.Parse(args)
	path := *text
	if path == "" {
		var err error
		if path, err = tinymoe.FindText("."); err != nil {
			return err
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	rep, err := tinymoe.Prepare(string(b), *vocab, *out)
	if err != nil {
		return err
	}
	j, _ := json.MarshalIndent(rep, "", "  ")
	fmt.Println(string(j))
	return nil
}
