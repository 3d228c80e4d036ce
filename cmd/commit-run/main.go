// Command commit-run runs Mixture-of-Experts language models stored as GGUF files.
//
// It is a thin shell over package engine: every subcommand parses its flags, calls the engine
// and prints. The subcommands are
//
//	commit-run chat                 interactive multi-turn chat (or one answer per piped line)
//	commit-run generate             continue a prompt or a list of token ids
//	commit-run inspect [FILE]       describe a GGUF model: shape, experts, weight bytes
//	commit-run logits --tokens IDS  next-token probabilities after every position, as JSON lines
//	commit-run eval ppl --text FILE perplexity and bits per byte of a text file
//
// Global flags (-m, --threads, --ctx, --kv-type, --device, --profile) apply to every subcommand.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	// Signals are caught here, not in run, so that tests can drive run without touching the
	// process's signal handling.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	code := run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr, sig)
	signal.Stop(sig)
	os.Exit(code)
}
