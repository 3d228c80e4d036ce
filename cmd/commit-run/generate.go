package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/commit-run/commit-run/engine"
)

// generateJSON is the --json output of generate. Field names are part of the CLI's contract
// (scripts and the golden tests read them).
type generateJSON struct {
	Tokens        []int32 `json:"tokens"`
	Text          string  `json:"text"`
	Stop          string  `json:"stop"`
	PromptTokens  int     `json:"prompt_tokens"`
	PromptSeconds float64 `json:"prompt_seconds"`
	DecodeSeconds float64 `json:"decode_seconds"`
	Seed          uint64  `json:"seed"`
}

// generateFlags are generate's own flags, and the generation flags it shares with chat.
type generateFlags struct {
	g      genFlags
	prompt string
	tokens string
	asJSON bool
}

func (a *app) generateCmd() *cobra.Command {
	var gf generateFlags
	cmd := &cobra.Command{
		Use:   "generate",
		Short: "Continue a prompt (--prompt TEXT) or a list of token ids (--tokens 1,2,3)",
		Example: "  commit-run generate -m model.gguf --prompt 'Once upon a time' -n 64\n" +
			"  commit-run generate --tokens 1,450,4996 -n 8 --greedy --json",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.generate(cmd, &gf)
		},
	}
	f := cmd.Flags()
	f.StringVar(&gf.prompt, "prompt", "", "raw prompt `TEXT` (tokenized with the model's BOS)")
	f.StringVar(&gf.tokens, "tokens", "", "prompt as token `IDS`, e.g. 1,2,3")
	f.BoolVar(&gf.asJSON, "json", false, "print one JSON object (tokens, text, stop, timing) instead of streaming text")
	gf.g.register(f, true)
	return cmd
}

// generate continues the prompt, streaming the text as it comes unless --json waits for the
// whole result.
func (a *app) generate(cmd *cobra.Command, gf *generateFlags) error {
	hasPrompt, hasTokens := cmd.Flags().Changed("prompt"), cmd.Flags().Changed("tokens")
	if hasPrompt == hasTokens {
		return fmt.Errorf("generate needs exactly one of --prompt TEXT or --tokens IDS")
	}
	opts, err := gf.g.options()
	if err != nil {
		return err
	}
	var ids []int32
	if err := checkPrompt(hasPrompt, gf.prompt); err != nil {
		return err
	}
	if hasTokens {
		// Parse before loading the model: a typo should not cost a multi-GB load.
		if ids, err = parseTokens(gf.tokens); err != nil {
			return err
		}
	}
	m, s, closeAll, err := a.session()
	if err != nil {
		return err
	}
	defer closeAll()
	if ids, err = promptIDs(m, hasPrompt, gf.prompt, ids); err != nil {
		return err
	}

	printed := false
	if !gf.asJSON {
		opts.OnToken = func(t engine.Token) error {
			printed = printed || t.Text != ""
			_, err := io.WriteString(a.stdout, t.Text)
			return err
		}
	}
	res, err := s.Generate(cmd.Context(), ids, opts)
	if err != nil {
		if printed {
			// End the partial text's line so the error (Ctrl-C) does not trail it.
			fmt.Fprintln(a.stdout)
		}
		return err
	}
	return a.printGenerated(res, gf.asJSON, gf.g.seed)
}

// printGenerated ends a generation: the whole result as JSON, or, after the streamed text,
// its timing on stderr, out of the way of the text.
func (a *app) printGenerated(res engine.Result, asJSON bool, seed uint64) error {
	if asJSON {
		return writeJSON(a.stdout, generateJSON{
			Tokens:        nonNil(res.Tokens),
			Text:          res.Text,
			Stop:          string(res.Reason),
			PromptTokens:  res.PromptTokens,
			PromptSeconds: res.PromptSeconds,
			DecodeSeconds: res.DecodeSeconds,
			Seed:          seed,
		})
	}
	if !strings.HasSuffix(res.Text, "\n") {
		fmt.Fprintln(a.stdout)
	}
	printTiming(a.stderr, res, seed)
	return nil
}

// checkPrompt refuses a --prompt that is not UTF-8 text, before a model loads for it.
func checkPrompt(hasPrompt bool, prompt string) error {
	if err := engine.CheckUTF8(prompt); hasPrompt && err != nil {
		return fmt.Errorf("--prompt: %w", err)
	}
	return nil
}

// promptIDs tokenizes --prompt, or checks --tokens against the vocabulary.
func promptIDs(m *engine.Model, hasPrompt bool, prompt string, ids []int32) ([]int32, error) {
	if !hasPrompt {
		return ids, checkVocab(ids, m.Info().Vocab)
	}
	ids, err := m.Tokenize(prompt, true)
	if err != nil {
		return nil, fmt.Errorf("tokenize --prompt: %w", err)
	}
	if len(ids) == 0 {
		return nil, fmt.Errorf("--prompt gives no tokens (the model adds no BOS); give some text")
	}
	return ids, nil
}

// printTiming reports throughput like llama.cpp's timings. The first generated token comes
// from the prompt pass, so N generated tokens took N-1 decode steps.
func printTiming(w io.Writer, res engine.Result, seed uint64) {
	fmt.Fprintf(w, "prompt: %d tokens in %.3f s (%s)\n", res.PromptTokens, res.PromptSeconds,
		rate(res.PromptTokens, res.PromptSeconds))
	steps := max(len(res.Tokens)-1, 0)
	fmt.Fprintf(w, "decode: %d tokens in %.3f s (%s)\n", steps, res.DecodeSeconds, rate(steps, res.DecodeSeconds))
	fmt.Fprintf(w, "generated %d tokens, stop: %s, seed: %d\n", len(res.Tokens), res.Reason, seed)
}

func rate(n int, seconds float64) string {
	if n == 0 || seconds <= 0 {
		return "- tokens/s"
	}
	return fmt.Sprintf("%.2f tokens/s", float64(n)/seconds)
}

// writeJSON prints v on one line. HTML escaping is off: generated text full of \u003c is
// valid but unreadable.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// nonNil makes an empty token list print as [] rather than null.
func nonNil(ids []int32) []int32 {
	if ids == nil {
		return []int32{}
	}
	return ids
}
