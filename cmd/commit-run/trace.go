package main

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/commit-run/commit-run/trace"
	"github.com/commit-run/commit-run/tracerec"
)

func (a *app) traceCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "trace",
		Short: "Record and summarise routing traces (trace record, trace info)",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(a.traceRecordCmd(), a.traceInfoCmd())
	return cmd
}

func (a *app) traceRecordCmd() *cobra.Command {
	var (
		textFile, out, inputs string
		logits                bool
		window                int
	)
	cmd := &cobra.Command{
		Use:   "record --text FILE --out FILE.trace",
		Short: "Run the model over a text and record every token's expert routing",
		Long: "trace record runs -m over --text in windows (as eval ppl does) and writes, per token and MoE\n" +
			"layer, the chosen experts and their weights; --logits adds the router logits and --inputs the\n" +
			"router inputs (what the Commit Router trains on). The offloading benchmark replays the experts.",
		Example: "  commit-run trace record --text models/testdata/war-and-peace-heldout.txt --out heldout.trace --logits --inputs f16",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.record(cmd, "trace record", textFile, out, inputs, logits, window, 0)
		},
	}
	f := cmd.Flags()
	f.StringVar(&textFile, "text", "", "UTF-8 text `FILE` to run (- for stdin)")
	f.StringVar(&out, "out", "", "trace `FILE` to write")
	f.StringVar(&inputs, "inputs", "none", "store router inputs: none, f16 or f32")
	f.BoolVar(&logits, "logits", false, "store router logits")
	f.IntVar(&window, "window", 0, "tokens per evaluation window (0 = the context length)")
	return cmd
}

// record runs -m over a text file in windows and writes its routing trace to out: trace
// record and predictor collect.
func (a *app) record(cmd *cobra.Command, what, textFile, out, inputs string, logits bool, window, maxTokens int) error {
	if textFile == "" || out == "" {
		return fmt.Errorf("%s needs --text FILE and --out FILE", what)
	}
	in := trace.InputFormat(inputs)
	switch in {
	case trace.InputsNone, trace.InputsF16, trace.InputsF32:
	default:
		return fmt.Errorf("--inputs %q: want none, f16 or f32", inputs)
	}
	if maxTokens < 0 {
		return fmt.Errorf("--max-tokens %d: want 0 (all) or more", maxTokens)
	}
	text, m, err := a.windowedText(textFile, window)
	if err != nil {
		return err
	}
	defer m.Close()
	if text, err = m.FirstTokens(text, maxTokens); err != nil {
		return err
	}
	h := tracerec.Header(m, tracerec.Options{Inputs: in, Logits: logits, Source: textFile})
	if len(h.MoELayers) == 0 {
		return fmt.Errorf("%s: %s has no MoE layers", what, a.modelPath)
	}
	w, err := trace.Create(out, h)
	if err != nil {
		return err
	}
	n, err := tracerec.Text(cmd.Context(), m, text, window, w)
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("%s %s: %w (the file holds the tokens before the error)", what, out, err)
	}
	fmt.Fprintf(a.stderr, "recorded %d tokens x %d MoE layers to %s\n", n, len(h.MoELayers), out)
	return nil
}

func (a *app) traceInfoCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "info FILE.trace",
		Short: "Summarise a routing trace: header, tokens, and each layer's expert load",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := trace.Open(args[0])
			if err != nil {
				return err
			}
			defer r.Close()
			h := r.Header()
			loads := make([][]int, len(h.MoELayers))
			for i := range loads {
				loads[i] = make([]int, h.Experts)
			}
			var tok trace.Token
			n := 0
			for {
				err := r.NextInto(&tok)
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					return fmt.Errorf("%s: after %d tokens: %w", args[0], n, err)
				}
				for i, lr := range tok.Layers {
					for _, e := range lr.Experts {
						loads[i][e]++
					}
				}
				n++
			}
			kind := "recorded"
			if h.Synthetic {
				kind = "SYNTHETIC routing"
			}
			fmt.Fprintf(a.stdout, "%s: %s, model %q (%s), %d tokens, %d MoE layers, %d experts top-%d, inputs %s, logits %v\nsource: %s\n",
				args[0], kind, h.Model, h.Arch, n, len(h.MoELayers), h.Experts, h.Used, cmp.Or(string(h.Inputs), "none"), h.Logits, h.Source)
			if n == 0 {
				return nil
			}
			tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "layer\tmax/mean\tbalance\tunused experts")
			mean := float64(n*h.Used) / float64(h.Experts)
			for i, l := range h.MoELayers {
				busiest, unused := 0, 0
				for _, c := range loads[i] {
					busiest = max(busiest, c)
					if c == 0 {
						unused++
					}
				}
				fmt.Fprintf(tw, "%d\t%.2f\t%.2f\t%d\n", l, float64(busiest)/mean, mean/float64(busiest), unused)
			}
			return tw.Flush()
		},
	}
}
