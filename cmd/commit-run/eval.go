package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"

	"github.com/spf13/cobra"

	"github.com/commit-run/commit-run/engine"
)

// pplJSON is the --json output of eval ppl.
type pplJSON struct {
	Tokens      int     `json:"tokens"`
	Bytes       int     `json:"bytes"`
	Perplexity  float64 `json:"perplexity"`
	BitsPerByte float64 `json:"bits_per_byte"`
	NLL         float64 `json:"nll"`
	Window      int     `json:"window"`
}

func (a *app) evalCmd() *cobra.Command {
	// eval groups the quality measurements; ppl is the first. A bare `eval` prints its help.
	cmd := &cobra.Command{
		Use:   "eval",
		Short: "Measure model quality (eval ppl)",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(a.pplCmd())
	return cmd
}

// pplFlags are eval ppl's own flags.
type pplFlags struct {
	textFile  string
	window    int
	maxTokens int
	decode    bool
	asJSON    bool
}

func (a *app) pplCmd() *cobra.Command {
	var p pplFlags
	cmd := &cobra.Command{
		Use:     "ppl --text FILE",
		Short:   "Perplexity and bits per byte of a text file",
		Example: "  commit-run eval ppl -m model.gguf --text wiki.test.raw --window 512",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.ppl(cmd.Context(), p)
		},
	}
	f := cmd.Flags()
	f.StringVar(&p.textFile, "text", "", "UTF-8 text `FILE` to score (- for stdin)")
	f.IntVar(&p.window, "window", 0, "tokens per scoring window (0 = the context length)")
	f.IntVar(&p.maxTokens, "max-tokens", 0, "score only the text's first N tokens (0 = all)")
	f.BoolVar(&p.decode, "decode", false, "evaluate one token per forward pass, as decoding runs (always under --policy commit)")
	f.BoolVar(&p.asJSON, "json", false, "print one JSON object")
	return cmd
}

// ppl scores --text with the model and reports its perplexity, then what token drop, expert
// parallelism or committed routing did on the way, since each of them changes the figure.
func (a *app) ppl(ctx context.Context, p pplFlags) error {
	if p.textFile == "" {
		return fmt.Errorf("eval ppl needs --text FILE (- for stdin)")
	}
	if p.maxTokens < 0 {
		return fmt.Errorf("--max-tokens %d: want 0 (all) or more", p.maxTokens)
	}
	text, m, err := a.windowedText(p.textFile, p.window)
	if err != nil {
		return err
	}
	defer m.Close()
	// Committed routing acts on single-token passes, as decoding runs: batches would
	// measure the router's choice.
	commit := m.CommitRouterPath() != ""
	r, err := m.PerplexityWith(ctx, text, engine.PerplexityOptions{Window: p.window, MaxTokens: p.maxTokens, Decode: p.decode || commit})
	if err != nil {
		return err
	}
	if math.IsNaN(r.Perplexity) || math.IsInf(r.Perplexity, 0) || math.IsNaN(r.BitsPerByte) || math.IsInf(r.BitsPerByte, 0) {
		return fmt.Errorf("perplexity is not finite (%v over %d tokens, nll %v)", r.Perplexity, r.Tokens, r.NLL)
	}
	if p.asJSON {
		return writeJSON(a.stdout, pplJSON{
			Tokens: r.Tokens, Bytes: r.Bytes, Perplexity: r.Perplexity,
			BitsPerByte: r.BitsPerByte, NLL: r.NLL, Window: p.window,
		})
	}
	fmt.Fprintf(a.stdout, "tokens      %d\nbytes       %d\nperplexity  %.4f\nbits/byte   %.4f\n",
		r.Tokens, r.Bytes, r.Perplexity, r.BitsPerByte)
	a.printDropStats(m)
	a.printEPStats(m)
	a.printCommitStats(m)
	return nil
}

// printDropStats reports the share of expert choices capacity-aware token drop left out, and
// with expanded drop the experts it added.
func (a *app) printDropStats(m *engine.Model) {
	if st, ok := m.DropStats(); ok {
		c := float64(max(st.Choices, 1))
		fmt.Fprintf(a.stdout, "dropped     %.4f of %d expert choices (capacity factor %v, by %s)\n", float64(st.Dropped)/c, st.Choices, a.capacityFactor, a.dropMetric)
		if a.expandedDrop {
			fmt.Fprintf(a.stdout, "added       %.4f experts per choice beyond the top-k (expanded drop over %d devices)\n", float64(st.Added)/c, a.dropDevices)
		}
	}
}

// printEPStats reports what the expert-parallel planner dropped and added over all layers.
func (a *app) printEPStats(m *engine.Model) {
	if st, ok := m.EPStats(); ok {
		var choices, dropped, extra int64
		for _, l := range st.Layers {
			choices, dropped, extra = choices+l.Choices, dropped+l.Dropped, extra+l.Extra
		}
		c := float64(max(choices, 1))
		fmt.Fprintf(a.stdout, "expert parallelism over %d x %s, planned by %s: %.4f of %d expert choices dropped, %.4f added\n",
			st.Devices, m.Device(), st.Policy, float64(dropped)/c, choices, float64(extra)/c)
		if st.CalibrationTokens > 0 {
			fmt.Fprintf(a.stdout, "MACS reroutes with eta %g, expert centroids from %d tokens of %s\n", a.macsEta, st.CalibrationTokens, a.macsCalibration)
		}
	}
}

// printCommitStats reports how well the Commit Router predicted each layer's experts.
func (a *app) printCommitStats(m *engine.Model) {
	if st, ok := m.CommitStats(); ok {
		k := m.Info().ExpertsUsed
		fmt.Fprintf(a.stdout, "commit      one token per pass, Commit Router %s\n", m.CommitRouterPath())
		for _, l := range st.Layers {
			if l.Tokens == 0 {
				fmt.Fprintf(a.stdout, "  layer %-3d routed by its router (the cross-token prediction only prefetches; --cross-token commits it)\n", l.Layer)
				continue
			}
			fmt.Fprintf(a.stdout, "  layer %-3d accuracy %.3f  all wrong %.3f  OWA applied %.3f  (%d tokens)\n", l.Layer,
				l.Accuracy(k), float64(l.AllWrong)/float64(max(l.Tokens, 1)), float64(l.OWA)/float64(max(l.Tokens, 1)), l.Tokens)
		}
	}
}

// windowedText checks --window, reads --text and opens the model: what the commands that run
// a text in windows (eval ppl, inspect --routing, trace record) share.
func (a *app) windowedText(textFile string, window int) (string, *engine.Model, error) {
	if err := checkWindow(window); err != nil {
		return "", nil, err
	}
	text, err := readText(textFile, a.stdin)
	if err != nil {
		return "", nil, err
	}
	m, err := a.openModel()
	if err != nil {
		return "", nil, err
	}
	return string(text), m, nil
}

// maxTextBytes caps what --text reads: an endless file (/dev/zero, a pipe that never ends)
// would otherwise grow until the process dies. A quarter of a GiB is some 60 million tokens,
// far beyond any evaluation or training text the commands are for.
const maxTextBytes = 256 << 20

// readText reads the --text file, or stdin for "-", up to maxTextBytes.
func readText(name string, stdin io.Reader) ([]byte, error) {
	r := stdin
	if name != "-" {
		f, err := os.Open(name)
		if err != nil {
			return nil, fmt.Errorf("--text: %w", err)
		}
		defer f.Close()
		r = f
	}
	b, err := io.ReadAll(io.LimitReader(r, maxTextBytes+1))
	if err != nil {
		return nil, fmt.Errorf("--text %s: %w", name, err)
	}
	if len(b) > maxTextBytes {
		return nil, fmt.Errorf("--text %s: more than %d MiB; give a shorter text (--max-tokens scores only the first tokens of one)", name, maxTextBytes>>20)
	}
	if len(b) == 0 {
		return nil, fmt.Errorf("--text %s is empty", name)
	}
	if err := engine.CheckUTF8(string(b)); err != nil {
		return nil, fmt.Errorf("--text %s: %w", name, err)
	}
	return b, nil
}

// checkWindow checks --window: a window of one token predicts nothing.
func checkWindow(window int) error {
	if window < 0 || window == 1 || window > maxCtx {
		return fmt.Errorf("--window %d: want 0 (the context length) or 2 to %d", window, maxCtx)
	}
	return nil
}
