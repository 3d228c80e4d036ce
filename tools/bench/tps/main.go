// Command tps reads one JSON object on stdin and prints a decode speed in tokens/s: by default
// from commit-run's `generate --json` output ((tokens-1) / decode_seconds, since the first
// token comes from the prompt pass), or the number in -field.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
)

func main() {
	field := flag.String("field", "", "print this numeric field instead of computing from commit-run's output")
	flag.Parse()
	var v map[string]any
	if err := json.NewDecoder(os.Stdin).Decode(&v); err != nil {
		fmt.Fprintln(os.Stderr, "tps:", err)
		os.Exit(1)
	}
	if *field != "" {
		x, ok := v[*field].(float64)
		if !ok {
			fmt.Fprintf(os.Stderr, "tps: no numeric field %q in %v\n", *field, v)
			os.Exit(1)
		}
		fmt.Printf("%.3f\n", x)
		return
	}
	toks, _ := v["tokens"].([]any)
	secs, _ := v["decode_seconds"].(float64)
	if len(toks) < 2 || secs <= 0 {
		fmt.Fprintf(os.Stderr, "tps: need at least 2 tokens and a decode time, got %d and %g\n", len(toks), secs)
		os.Exit(1)
	}
	fmt.Printf("%.3f\n", float64(len(toks)-1)/secs)
}
