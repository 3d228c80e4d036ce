package main

import (
	"cmp"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/commit-run/commit-run/commitrouter"
	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/owa"
	"github.com/commit-run/commit-run/predictor"
	"github.com/commit-run/commit-run/trace"
	"github.com/commit-run/commit-run/tracerec"
)

func (a *app) predictorCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "predictor",
		Short: "Train and evaluate the Commit Router (predictor collect, train, eval, tune)",
		Long: "The Commit Router predicts each MoE layer's experts from the previous layer's router input, so\n" +
			"that --policy commit can load them ahead and compute with them. Collect a trace of router inputs\n" +
			"and logits on a training text, train the predictors (written next to the model as\n" +
			"MODEL.commit-router.gguf), then evaluate them on a held-out text.",
		Example: "  commit-run predictor collect --text train.txt --out train.trace --max-tokens 200000\n" +
			"  commit-run predictor train --trace train.trace\n" +
			"  commit-run predictor eval --trace heldout.trace --split all --text heldout.txt",
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(a.predictorCollectCmd(), a.predictorTrainCmd(), a.predictorEvalCmd(), a.predictorTuneCmd())
	return cmd
}

func (a *app) predictorCollectCmd() *cobra.Command {
	var (
		textFile, prompts, out, inputs string
		window, maxTokens, tokens      int
	)
	cmd := &cobra.Command{
		Use:   "collect (--text FILE | --prompts FILE) --out FILE.trace",
		Short: "Record router inputs and logits of every token and MoE layer over a text or prompts",
		Long: "predictor collect runs -m over --text in windows, or decodes --tokens tokens greedily after each\n" +
			"line of --prompts (the generated tokens are recorded, as CommitMoE collects its data), and streams,\n" +
			"per token and MoE layer, the router input h(i) and the router logits to a trace file in chunks:\n" +
			"what predictor train learns from.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if prompts == "" {
				return a.record(cmd, "predictor collect", textFile, out, inputs, true, window, maxTokens)
			}
			if textFile != "" || out == "" {
				return fmt.Errorf("predictor collect needs either --text or --prompts, and --out FILE")
			}
			if tokens < 1 || tokens > maxCtx {
				return fmt.Errorf("--tokens %d: want 1 or more per prompt", tokens)
			}
			in := trace.InputFormat(inputs)
			if in != trace.InputsF16 && in != trace.InputsF32 {
				return fmt.Errorf("--inputs %q: want f16 or f32", inputs)
			}
			ps, err := benchPromptList(prompts)
			if err != nil {
				return err
			}
			m, err := a.openModelWith(a.plainOptions())
			if err != nil {
				return err
			}
			defer m.Close()
			w, err := trace.Create(out, tracerec.Header(m, tracerec.Options{Inputs: in, Logits: true, Source: prompts}))
			if err != nil {
				return err
			}
			n, err := tracerec.Generated(cmd.Context(), m, ps, tokens, w)
			if cerr := w.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("predictor collect %s: %w (the file holds the tokens before the error)", out, err)
			}
			fmt.Fprintf(a.stderr, "recorded %d generated tokens of %d prompts to %s\n", n, len(ps), out)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&textFile, "text", "", "UTF-8 text `FILE` to run (- for stdin)")
	f.StringVar(&prompts, "prompts", "", "`FILE` of prompts, one per line, to decode after")
	f.IntVar(&tokens, "tokens", 20, "with --prompts: tokens decoded and recorded per prompt")
	f.StringVar(&out, "out", "", "trace `FILE` to write")
	f.StringVar(&inputs, "inputs", "f16", "how to store router inputs: f16 or f32")
	f.IntVar(&window, "window", 256, "tokens per evaluation window (0 = the context length)")
	f.IntVar(&maxTokens, "max-tokens", 0, "run only the text's first N tokens (0 = all)")
	return cmd
}

func (a *app) predictorTrainCmd() *cobra.Command {
	var (
		tracePath, out, init string
		o                    commitrouter.TrainOptions
	)
	cmd := &cobra.Command{
		Use:   "train --trace FILE",
		Short: "Train the Commit Router of -m on a collected trace",
		Long: "predictor train fits, per MoE layer, a linear predictor of the next layer's router logits (a\n" +
			"two-layer MLP for the last layer, which predicts the next token's first) by minimising\n" +
			"KL(softmax(true) || softmax(predicted)) with Adam, the learning rate halved every --lr-step epochs,\n" +
			"on an 80/20 train/validation split, stopping early on the validation loss. The predictors start\n" +
			"from the model's next routers (--init router) or random weights (--init random).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if tracePath == "" {
				return fmt.Errorf("predictor train needs --trace FILE (record one with predictor collect)")
			}
			switch init {
			case "router":
			case "random":
				o.RandomInit = true
			default:
				return fmt.Errorf("--init %q: want router or random", init)
			}
			if err := checkTrainFlags(o); err != nil {
				return err
			}
			o.Threads = a.threads
			m, err := a.openModelWith(a.plainOptions())
			if err != nil {
				return err
			}
			defer m.Close()
			out = cmp.Or(out, predictor.SidecarPath(a.modelPath))
			var mu sync.Mutex
			o.Progress = func(e predictor.EpochReport) {
				mu.Lock()
				defer mu.Unlock()
				fmt.Fprintf(a.stderr, "net %d  epoch %3d  lr %.2e  train %.5f  val %.5f  val accuracy %.3f  %s\n",
					e.Net, e.Epoch, e.LR, e.TrainLoss, e.ValLoss, e.ValAccuracy, e.Elapsed.Round(time.Millisecond))
			}
			start := time.Now()
			r, err := commitrouter.Train(cmd.Context(), m, tracePath, o)
			if err != nil {
				return err
			}
			if err := predictor.Save(out, r); err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "trained %d predictors (%d parameters) in %s; wrote %s\n", len(r.Nets), r.Params(), time.Since(start).Round(time.Second), out)
			return nil
		},
	}
	d := predictor.DefaultTrainOptions()
	f := cmd.Flags()
	f.StringVar(&tracePath, "trace", "", "trace `FILE` from predictor collect")
	f.StringVar(&out, "out", "", "Commit Router `FILE` to write (default: MODEL.commit-router.gguf beside -m)")
	f.StringVar(&init, "init", "router", "initial weights: router (the model's next routers, rescaled) or random")
	f.Float64Var(&o.LR, "lr", d.LR, "Adam learning rate")
	f.IntVar(&o.StepEpochs, "lr-step", d.StepEpochs, "multiply the learning rate by --lr-gamma every N epochs")
	f.Float64Var(&o.Gamma, "lr-gamma", d.Gamma, "learning rate decay factor")
	f.IntVar(&o.MaxEpochs, "epochs", d.MaxEpochs, "most epochs per predictor")
	f.IntVar(&o.Patience, "patience", d.Patience, "stop after N epochs without a better validation loss")
	f.Float64Var(&o.MinDelta, "min-delta", d.MinDelta, "relative improvement of the validation loss that counts as better for --patience")
	f.IntVar(&o.Batch, "batch", d.Batch, "samples per Adam step")
	f.Float64Var(&o.ValFraction, "val", d.ValFraction, "share of the samples held out for validation")
	f.Uint64Var(&o.Seed, "seed", d.Seed, "seed of the split, the shuffles and random initial weights")
	f.IntVar(&o.MaxTokens, "max-tokens", 0, "read only the trace's first N tokens (0 = all)")
	return cmd
}

// checkTrainFlags rejects training options no run could use.
func checkTrainFlags(o commitrouter.TrainOptions) error {
	switch {
	case !(o.LR > 0 && o.LR < 1):
		return fmt.Errorf("--lr %v: want a rate in (0, 1)", o.LR)
	case o.StepEpochs < 1 || o.StepEpochs > 1e6:
		return fmt.Errorf("--lr-step %d: want 1 or more epochs", o.StepEpochs)
	case !(o.Gamma > 0 && o.Gamma <= 1):
		return fmt.Errorf("--lr-gamma %v: want a factor in (0, 1]", o.Gamma)
	case o.MaxEpochs < 1 || o.MaxEpochs > 1e6:
		return fmt.Errorf("--epochs %d: want 1 to 1000000", o.MaxEpochs)
	case o.Patience < 1:
		return fmt.Errorf("--patience %d: want 1 or more epochs", o.Patience)
	case !(o.MinDelta >= 0 && o.MinDelta < 1):
		return fmt.Errorf("--min-delta %v: want a relative improvement in [0, 1)", o.MinDelta)
	case o.Batch < 1 || o.Batch > 1<<20:
		return fmt.Errorf("--batch %d: want 1 to %d", o.Batch, 1<<20)
	case !(o.ValFraction > 0 && o.ValFraction < 1):
		return fmt.Errorf("--val %v: want a share in (0, 1)", o.ValFraction)
	case o.MaxTokens < 0:
		return fmt.Errorf("--max-tokens %d: want 0 (all) or more", o.MaxTokens)
	}
	return nil
}

// loadRouter loads --predictor-file, or -m's sidecar.
func (a *app) loadRouter() (*predictor.Router, string, error) {
	path := cmp.Or(a.predictorFile, predictor.SidecarPath(a.modelPath))
	r, err := predictor.Load(path)
	if err != nil {
		return nil, path, err
	}
	return r, path, nil
}

func (a *app) predictorEvalCmd() *cobra.Command {
	var (
		tracePath, split, textFile string
		window, maxTokens          int
		maxTraceTokens             int
	)
	cmd := &cobra.Command{
		Use:   "eval --trace FILE [--text FILE]",
		Short: "Score the Commit Router: accuracy per layer, accuracy vs router certainty, and quality",
		Long: "predictor eval scores the Commit Router of -m (--predictor-file, or the model's sidecar) on a trace:\n" +
			"per MoE layer the top-k accuracy |Pred ∩ True|/k beside the frequency baseline (the layer's k most\n" +
			"used experts), and for each number of correct predictions the average router certainty\n" +
			"(KL of the router's softmax from uniform; CommitMoE Figure 2). With --text it also measures\n" +
			"perplexity token at a time for the router's choice, commit without OWA, with neutral OWA, with the\n" +
			"model's OWA (or --owa), and with the router's experts replaced only where every prediction is\n" +
			"wrong (CommitMoE Tables 3 and 1).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if tracePath == "" && textFile == "" {
				return fmt.Errorf("predictor eval needs --trace FILE (from predictor collect on a held-out text) or --text FILE")
			}
			var sp predictor.Split
			switch split {
			case "val":
				sp = predictor.Validation
			case "all":
				sp = predictor.All
			case "train":
				sp = predictor.Training
			default:
				return fmt.Errorf("--split %q: want val (the 20%% validation part of a training trace), all (a held-out trace) or train", split)
			}
			if maxTokens < 0 || maxTraceTokens < 0 {
				return fmt.Errorf("--max-tokens: want 0 (all) or more")
			}
			r, path, err := a.loadRouter()
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "Commit Router %s for %q (%s), %d predictors, %d parameters\n", path, r.ID.Model, r.ID.Arch, len(r.Nets), r.Params())
			if tracePath != "" {
				m, err := a.openModelWith(a.plainOptions())
				if err != nil {
					return err
				}
				rep, err := commitrouter.Evaluate(m, r, tracePath, sp, maxTraceTokens)
				m.Close()
				if err != nil {
					return err
				}
				if err := a.printRouterEval(rep, r, tracePath, split); err != nil {
					return err
				}
			}
			if textFile == "" {
				return nil
			}
			return a.printQuality(cmd, textFile, window, maxTokens)
		},
	}
	f := cmd.Flags()
	f.StringVar(&tracePath, "trace", "", "trace `FILE` from predictor collect")
	f.StringVar(&split, "split", "val", "which samples of the trace: val, all or train")
	f.IntVar(&maxTraceTokens, "trace-tokens", 0, "read only the trace's first N tokens (0 = all)")
	f.StringVar(&textFile, "text", "", "held-out text `FILE` for the perplexity comparison")
	f.IntVar(&window, "window", 256, "tokens per perplexity window (0 = the context length)")
	f.IntVar(&maxTokens, "max-tokens", 0, "score only the text's first N tokens (0 = all)")
	return cmd
}

// printRouterEval prints the accuracy table and the Figure 2 table.
func (a *app) printRouterEval(rep predictor.EvalReport, r *predictor.Router, tracePath, split string) error {
	fmt.Fprintf(a.stdout, "\naccuracy on %s (%s samples), k = %d\n", tracePath, split, rep.Used)
	tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "predictor\tinput layer\tpredicts\tkind\tsamples\taccuracy\tfrequency baseline\t")
	for j, n := range rep.Nets {
		kind := "linear"
		if r.Nets[j].Hidden > 0 {
			kind = fmt.Sprintf("MLP %d", r.Nets[j].Hidden)
		}
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%d\t%.3f\t%.3f\t\n", j, r.ID.MoELayers[j], n.Target, kind, n.Samples, n.Accuracy, n.FreqAccuracy)
	}
	fmt.Fprintf(tw, "all\t\t\t\t%d\t%.3f\t%.3f\t\n", rep.Samples, rep.Accuracy, rep.FreqAccuracy)
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(a.stdout, "\nrouter certainty by correct predictions (KL of the predicted layer's router softmax from uniform, nats; CommitMoE Figure 2)\n")
	tw = tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := "predictor\t"
	for c := 0; c <= rep.Used; c++ {
		head += fmt.Sprintf("%d/%d share\t%d/%d KL\t", c, rep.Used, c, rep.Used)
	}
	fmt.Fprintln(tw, head)
	row := func(name string, bs []predictor.Bucket) {
		line := name + "\t"
		for _, b := range bs {
			if b.Samples == 0 {
				line += "0\t-\t"
				continue
			}
			line += fmt.Sprintf("%.3f\t%.3f\t", b.Share, b.MeanKL)
		}
		fmt.Fprintln(tw, line)
	}
	for j, n := range rep.Nets {
		row(strconv.Itoa(j), n.Buckets)
	}
	row("all", rep.Buckets)
	return tw.Flush()
}

// printQuality runs the quality comparison on a held-out text.
func (a *app) printQuality(cmd *cobra.Command, textFile string, window, maxTokens int) error {
	if err := checkWindow(window); err != nil {
		return err
	}
	text, err := readText(textFile, a.stdin)
	if err != nil {
		return err
	}
	opts := a.plainOptions()
	start := time.Now()
	rows, err := commitrouter.Quality(cmd.Context(), a.modelPath, opts, string(text),
		engine.PerplexityOptions{Window: window, MaxTokens: maxTokens}, commitrouter.Variants(a.predictorFile, a.owaSpec))
	if err != nil {
		return err
	}
	fmt.Fprintf(a.stdout, "\nheld-out perplexity of %s, one token per pass (window %d%s), %s\n", textFile, window, tokensNote(maxTokens), time.Since(start).Round(time.Second))
	tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "routing\tperplexity\tvs base\taccuracy\tall wrong\tOWA applied\t")
	for i, r := range rows {
		delta := "-"
		if i > 0 {
			delta = fmt.Sprintf("%+.2f%%", 100*r.Delta)
		}
		fmt.Fprintf(tw, "%s\t%.4f\t%s\t%s\t%s\t%s\t\n", r.Name, r.Perplexity, delta,
			orDash(r.Accuracy, "%.3f", true), orDash(r.AllWrong, "%.3f", true), orDash(r.OWA, "%.3f", true))
	}
	return tw.Flush()
}

func tokensNote(n int) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf(", first %d tokens", n)
}

func (a *app) predictorTuneCmd() *cobra.Command {
	var (
		textFile, alphas  string
		window, maxTokens int
		top               int
	)
	cmd := &cobra.Command{
		Use:   "tune --text FILE",
		Short: "Search OWA's alpha1, alpha2 and trigger range for the lowest perplexity under commit",
		Long: "predictor tune measures, token at a time, the perplexity of committed routing on a validation text\n" +
			"for every alpha1 and alpha2 in --alphas and every trigger range of 1 to k-1 correct predictions, and\n" +
			"prints the best settings as an --owa value. Tune on a text that quality is not reported on.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if textFile == "" {
				return fmt.Errorf("predictor tune needs --text FILE (a validation text)")
			}
			if err := checkWindow(window); err != nil {
				return err
			}
			if maxTokens < 0 || top < 1 {
				return fmt.Errorf("--max-tokens %d, --top %d: want 0 or more tokens and 1 or more rows", maxTokens, top)
			}
			var as []float64
			for _, s := range strings.Split(alphas, ",") {
				v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
				if err != nil || !(v > 0 && v <= 10) {
					return fmt.Errorf("--alphas %q: %q is not a factor in (0, 10]", alphas, s)
				}
				as = append(as, v)
			}
			text, err := readText(textFile, a.stdin)
			if err != nil {
				return err
			}
			opts := a.plainOptions()
			n := 0
			res, err := commitrouter.TuneOWA(cmd.Context(), a.modelPath, opts, a.predictorFile, string(text),
				engine.PerplexityOptions{Window: window, MaxTokens: maxTokens}, as, func(r commitrouter.TuneResult) {
					n++
					fmt.Fprintf(a.stderr, "%4d  %s  perplexity %.4f\n", n, owaSpec(r.Params), r.Perplexity)
				})
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "rank\tperplexity\t--owa")
			for i, r := range res[:min(top, len(res))] {
				fmt.Fprintf(tw, "%d\t%.4f\t%s\n", i+1, r.Perplexity, owaSpec(r.Params))
			}
			return tw.Flush()
		},
	}
	f := cmd.Flags()
	f.StringVar(&textFile, "text", "", "validation text `FILE`")
	f.StringVar(&alphas, "alphas", "1.0,1.1,1.2,1.3,1.4", "comma-separated values tried for alpha1 and for alpha2")
	f.IntVar(&window, "window", 256, "tokens per perplexity window (0 = the context length)")
	f.IntVar(&maxTokens, "max-tokens", 2048, "score only the text's first N tokens (0 = all)")
	f.IntVar(&top, "top", 10, "rows of the best settings to print")
	return cmd
}

// owaSpec writes p as an --owa value.
func owaSpec(p owa.Params) string {
	r := strconv.Itoa(p.MinCorrect)
	if p.MaxCorrect != p.MinCorrect {
		r += "-" + strconv.Itoa(p.MaxCorrect)
	}
	return fmt.Sprintf("a1=%s,a2=%s,range=%s", fmtFactor(p.Alpha1), fmtFactor(p.Alpha2), r)
}

func fmtFactor(v float64) string {
	if v == math.Trunc(v) {
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return strconv.FormatFloat(v, 'f', -1, 64)
}
