package main

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/tracerec"
)

// inspectJSON is the --json output of inspect: engine.Info with stable snake_case names and
// the derived shares, so scripts need not recompute them.
type inspectJSON struct {
	Path             string           `json:"path"`
	Architecture     string           `json:"architecture"`
	Name             string           `json:"name,omitempty"`
	Layers           int              `json:"layers"`
	DenseLayers      int              `json:"dense_layers"`
	NextN            int              `json:"nextn_layers,omitempty"`
	Embedding        int              `json:"d_model"`
	Heads            int              `json:"heads"`
	HeadsKV          int              `json:"heads_kv"`
	Vocab            int              `json:"vocab"`
	Context          int              `json:"context"`
	Experts          int              `json:"experts"`
	ExpertsUsed      int              `json:"experts_used"`
	SharedExperts    int              `json:"shared_experts"`
	ExpertFFN        int              `json:"expert_ffn"`
	Gating           string           `json:"gating,omitempty"`
	SelectionBias    bool             `json:"selection_bias,omitempty"`
	ExpertGroups     int              `json:"expert_groups,omitempty"`
	ExpertGroupsUsed int              `json:"expert_groups_used,omitempty"`
	WeightsNorm      bool             `json:"expert_weights_norm,omitempty"`
	WeightsScale     float32          `json:"expert_weights_scale,omitempty"`
	RouterBias       bool             `json:"router_bias,omitempty"`
	ExpertBiases     bool             `json:"expert_biases,omitempty"`
	Activation       string           `json:"activation,omitempty"`
	SlidingWindow    int              `json:"sliding_window,omitempty"`
	SlidingLayers    int              `json:"sliding_window_layers,omitempty"`
	AttentionSinks   bool             `json:"attention_sinks,omitempty"`
	DeltaNetLayers   int              `json:"deltanet_layers,omitempty"`
	DeltaNetKHeads   int              `json:"deltanet_key_heads,omitempty"`
	DeltaNetVHeads   int              `json:"deltanet_value_heads,omitempty"`
	DeltaNetHeadDim  int              `json:"deltanet_head_dim,omitempty"`
	DeltaNetConvK    int              `json:"deltanet_conv_kernel,omitempty"`
	RecurrentState   int64            `json:"recurrent_state_bytes,omitempty"`
	GatedAttention   int              `json:"gated_attention_layers,omitempty"`
	Parameters       int64            `json:"parameters"`
	ExpertParameters int64            `json:"expert_parameters"`
	ExpertBytes      int64            `json:"expert_bytes"`
	NonExpertBytes   int64            `json:"non_expert_bytes"`
	ExpertShare      float64          `json:"expert_bytes_percent"`
	TensorTypes      map[string]int   `json:"tensor_types"`
	TensorTypeBytes  map[string]int64 `json:"tensor_type_bytes"`
	HasChatTemplate  bool             `json:"has_chat_template"`
}

func (a *app) inspectCmd() *cobra.Command {
	var (
		asJSON   bool
		routing  bool
		textFile string
		window   int
	)
	cmd := &cobra.Command{
		Use:   "inspect [FILE]",
		Short: "Describe a GGUF model: shape, experts, parameters and weight bytes (FILE defaults to -m)",
		Long: "inspect describes a GGUF model without loading its weights.\n" +
			"With --routing it runs the model over --text and reports, per MoE layer, the expert load\n" +
			"(busiest expert over the mean, balancedness = mean/max) and the router's certainty: the KL\n" +
			"divergence of the router softmax from uniform, in nats (0 = no preference, ln(experts) = certain).",
		Example: "  commit-run inspect --routing --text models/testdata/war-and-peace-heldout.txt",
		Args:    cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			path := a.modelPath
			if len(args) == 1 {
				path = args[0]
			}
			if err := a.checkModelPath(path); err != nil {
				return err
			}
			if routing || textFile != "" {
				if !routing || textFile == "" {
					return fmt.Errorf("inspect: --routing and --text FILE go together")
				}
				a.modelPath = path
				return a.inspectRouting(cmd, textFile, window, asJSON)
			}
			info, err := engine.Inspect(path)
			if err != nil {
				return fmt.Errorf("inspect %s: %w", path, err)
			}
			if asJSON {
				return writeJSON(a.stdout, toInspectJSON(info))
			}
			return printInfo(a.stdout, info)
		},
	}
	f := cmd.Flags()
	f.BoolVar(&asJSON, "json", false, "print one JSON object")
	f.BoolVar(&routing, "routing", false, "run the model over --text and report expert load and router certainty per layer")
	f.StringVar(&textFile, "text", "", "UTF-8 text `FILE` for --routing (- for stdin)")
	f.IntVar(&window, "window", 0, "tokens per evaluation window for --routing (0 = the context length)")
	return cmd
}

// routingJSON is the --routing --json output.
type routingJSON struct {
	Tokens int                `json:"tokens"`
	Layers []layerRoutingJSON `json:"layers"`
}

type layerRoutingJSON struct {
	Layer        int     `json:"layer"`
	Experts      int     `json:"experts"`
	Used         int     `json:"experts_used"`
	Tokens       int     `json:"tokens"`
	Load         []int   `json:"load"`
	MaxOverMean  float64 `json:"max_over_mean"`
	Balancedness float64 `json:"balancedness"`
	KLMean       float64 `json:"kl_mean"`
	KLStd        float64 `json:"kl_std"`
	KLP10        float64 `json:"kl_p10"`
	KLP50        float64 `json:"kl_p50"`
	KLP90        float64 `json:"kl_p90"`
	KLMax        float64 `json:"kl_max"`
}

func (a *app) inspectRouting(cmd *cobra.Command, textFile string, window int, asJSON bool) error {
	text, m, err := a.windowedText(textFile, window)
	if err != nil {
		return err
	}
	defer m.Close()
	r, err := tracerec.Routing(cmd.Context(), m, text, window)
	if err != nil {
		return err
	}
	if len(r.Layers) == 0 {
		return fmt.Errorf("inspect --routing: %s has no MoE layers", a.modelPath)
	}
	if asJSON {
		out := routingJSON{Tokens: r.Tokens}
		for _, l := range r.Layers {
			out.Layers = append(out.Layers, layerRoutingJSON{Layer: l.Layer, Experts: l.Experts, Used: l.Used,
				Tokens: l.Tokens, Load: l.Load, MaxOverMean: l.MaxOverMean, Balancedness: l.Balancedness,
				KLMean: l.KLMean, KLStd: l.KLStd, KLP10: l.KLP10, KLP50: l.KLP50, KLP90: l.KLP90, KLMax: l.KLMax})
		}
		return writeJSON(a.stdout, out)
	}
	fmt.Fprintf(a.stdout, "routing over %d tokens; KL of the router softmax from uniform in nats (max ln %d = %.3f)\n",
		r.Tokens, r.Layers[0].Experts, r.Layers[0].KLMax)
	tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "layer\texperts\tmax/mean\tbalance\tKL mean\tKL sd\tKL p10\tKL p50\tKL p90\tload per expert (x mean, busiest first)")
	for _, l := range r.Layers {
		fmt.Fprintf(tw, "%d\t%d top-%d\t%.2f\t%.2f\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\t%s\n", l.Layer, l.Experts, l.Used,
			l.MaxOverMean, l.Balancedness, l.KLMean, l.KLStd, l.KLP10, l.KLP50, l.KLP90, loadLine(l))
	}
	return tw.Flush()
}

// loadLine lists experts' loads relative to the mean, busiest first; long lists are cut.
func loadLine(l tracerec.LayerRouting) string {
	mean := float64(l.Tokens*l.Used) / float64(l.Experts)
	loads := slices.Clone(l.Load)
	slices.SortFunc(loads, func(x, y int) int { return cmp.Compare(y, x) })
	var b strings.Builder
	for i, n := range loads {
		if i == 12 && len(loads) > 16 {
			fmt.Fprintf(&b, " ... %.2f", float64(loads[len(loads)-1])/mean)
			break
		}
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%.2f", float64(n)/mean)
	}
	return b.String()
}

func toInspectJSON(in *engine.Info) inspectJSON {
	types, typeBytes := in.TensorTypes, in.TensorTypeBytes
	if types == nil {
		types = map[string]int{}
	}
	if typeBytes == nil {
		typeBytes = map[string]int64{}
	}
	return inspectJSON{
		Path: in.Path, Architecture: in.Architecture, Name: in.Name,
		Layers: in.Layers, DenseLayers: in.Layers - len(in.MoELayers), NextN: in.NextN,
		Embedding: in.Embedding, Heads: in.Heads, HeadsKV: in.HeadsKV,
		Vocab: in.Vocab, Context: in.Context,
		Experts: in.Experts, ExpertsUsed: in.ExpertsUsed, SharedExperts: in.SharedExperts, ExpertFFN: in.ExpertFFN,
		Gating: in.Gating, SelectionBias: in.SelectionBias, ExpertGroups: in.ExpertGroups, ExpertGroupsUsed: in.ExpertGroupsUsed,
		WeightsNorm: in.ExpertWeightsNorm, WeightsScale: in.ExpertWeightsScale,
		RouterBias: in.RouterBias, ExpertBiases: in.ExpertBiases, Activation: in.Activation,
		SlidingWindow: in.SlidingWindow, SlidingLayers: in.SlidingLayers, AttentionSinks: in.AttentionSinks,
		DeltaNetLayers: in.DeltaNetLayers, DeltaNetKHeads: in.DeltaNetKHeads, DeltaNetVHeads: in.DeltaNetVHeads,
		DeltaNetHeadDim: in.DeltaNetHeadDim, DeltaNetConvK: in.DeltaNetConvK,
		RecurrentState: in.RecurrentStateBytes, GatedAttention: in.GatedAttentionLayers,
		Parameters: in.Parameters, ExpertParameters: in.ExpertParameters,
		ExpertBytes: in.ExpertBytes, NonExpertBytes: in.NonExpertBytes,
		ExpertShare:     share(in.ExpertBytes, in.ExpertBytes+in.NonExpertBytes),
		TensorTypes:     types,
		TensorTypeBytes: typeBytes,
		HasChatTemplate: in.ChatTemplate != "",
	}
}

// printInfo writes the human-readable report, tensor types largest first since those decide
// the memory plan.
func printInfo(w io.Writer, in *engine.Info) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(k, format string, v ...any) { fmt.Fprintf(tw, k+"\t"+format+"\n", v...) }
	row("file", "%s", in.Path)
	row("architecture", "%s", in.Architecture)
	if in.Name != "" {
		row("name", "%s", in.Name)
	}
	layers := fmt.Sprint(in.Layers)
	if dense := in.Layers - len(in.MoELayers); dense > 0 && len(in.MoELayers) > 0 {
		layers += fmt.Sprintf(" (%d dense, %d MoE)", dense, len(in.MoELayers))
	}
	if in.NextN > 0 {
		blocks := "block"
		if in.NextN > 1 {
			blocks += "s"
		}
		layers += fmt.Sprintf(", and %d next-token-prediction %s not run (%s parameters)", in.NextN, blocks, humanCount(in.SkippedParameters))
	}
	row("layers", "%s", layers)
	row("d_model", "%d", in.Embedding)
	row("heads", "%d (kv %d)", in.Heads, in.HeadsKV)
	row("vocab", "%d", in.Vocab)
	row("context", "%d", in.Context)
	if at := attentionText(in); at != "" {
		row("attention", "%s", at)
	}
	if in.Experts > 0 {
		row("experts", "%d routed, top-%d, %d shared, expert ffn %d%s", in.Experts, in.ExpertsUsed, in.SharedExperts, in.ExpertFFN, expertText(in))
		row("routing", "%s", routingText(in))
	} else {
		row("experts", "none (dense model)")
	}
	row("parameters", "%s (%d), experts %s (%.1f%%)", humanCount(in.Parameters), in.Parameters,
		humanCount(in.ExpertParameters), share(in.ExpertParameters, in.Parameters))
	total := in.ExpertBytes + in.NonExpertBytes
	row("expert weights", "%s (%.1f%%)", humanBytes(in.ExpertBytes), share(in.ExpertBytes, total))
	row("non-expert weights", "%s (%.1f%%)", humanBytes(in.NonExpertBytes), share(in.NonExpertBytes, total))
	row("chat template", "%s", map[bool]string{true: "yes", false: "no"}[in.ChatTemplate != ""])

	names := make([]string, 0, len(in.TensorTypes))
	for name := range in.TensorTypes {
		names = append(names, name)
	}
	slices.SortFunc(names, func(x, y string) int {
		return cmp.Or(cmp.Compare(in.TensorTypeBytes[y], in.TensorTypeBytes[x]), cmp.Compare(x, y))
	})
	var typeTotal int64
	for _, b := range in.TensorTypeBytes {
		typeTotal += b
	}
	row("tensor types", "%d", len(names))
	for _, name := range names {
		b := in.TensorTypeBytes[name]
		row("  "+name, "%d tensors, %s (%.1f%%)", in.TensorTypes[name], humanBytes(b), share(b, typeTotal))
	}
	return tw.Flush()
}

// routingText says how the first MoE layer chooses and weighs experts, in the order the
// router applies the steps.
func routingText(in *engine.Info) string {
	parts := []string{in.Gating}
	if in.RouterBias {
		parts[0] = "biased logits, " + in.Gating
	}
	if in.SelectionBias {
		parts = append(parts, "selection bias")
	}
	if in.ExpertGroups > 1 {
		parts = append(parts, fmt.Sprintf("top-%d within the best %d of %d groups", in.ExpertsUsed, in.ExpertGroupsUsed, in.ExpertGroups))
	}
	if in.ExpertWeightsNorm {
		parts = append(parts, "renormalised")
	}
	if in.ExpertWeightsScale != 0 {
		parts = append(parts, fmt.Sprintf("scaled by %g", in.ExpertWeightsScale))
	}
	return strings.Join(parts, ", ")
}

// attentionText says what a model's attention has beyond causal softmax over every position,
// or instead of it (empty: nothing).
func attentionText(in *engine.Info) string {
	var parts []string
	if in.SlidingWindow > 0 {
		parts = append(parts, fmt.Sprintf("sliding window of %d positions on %d of %d layers", in.SlidingWindow, in.SlidingLayers, in.Layers))
	}
	if in.AttentionSinks {
		parts = append(parts, "a sink logit per head")
	}
	if in.DeltaNetLayers > 0 {
		parts = append(parts, fmt.Sprintf("%d of %d layers gated DeltaNet (%d key and %d value heads of %d, a convolution of %d; %s of recurrent state per sequence)",
			in.DeltaNetLayers, in.Layers, in.DeltaNetKHeads, in.DeltaNetVHeads, in.DeltaNetHeadDim, in.DeltaNetConvK, humanBytes(in.RecurrentStateBytes)))
	}
	if in.GatedAttentionLayers > 0 {
		layers := "layers"
		if in.GatedAttentionLayers == 1 {
			layers = "layer"
		}
		parts = append(parts, fmt.Sprintf("%d full-attention %s with a sigmoid-gated output", in.GatedAttentionLayers, layers))
	}
	return strings.Join(parts, ", ")
}

// expertText says how the experts differ from plain SwiGLU blocks (empty: they do not).
func expertText(in *engine.Info) string {
	var parts []string
	if in.ExpertBiases {
		parts = append(parts, "biased")
	}
	if in.Activation != "" && in.Activation != "swiglu" {
		parts = append(parts, in.Activation)
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, ", ") + ")"
}
