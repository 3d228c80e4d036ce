package main

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/commit-run/commit-run/engine"
)

// inspectJSON is the --json output of inspect: engine.Info with stable snake_case names and
// the derived shares, so scripts need not recompute them.
type inspectJSON struct {
	Path             string           `json:"path"`
	Architecture     string           `json:"architecture"`
	Name             string           `json:"name,omitempty"`
	Layers           int              `json:"layers"`
	Embedding        int              `json:"d_model"`
	Heads            int              `json:"heads"`
	HeadsKV          int              `json:"heads_kv"`
	Vocab            int              `json:"vocab"`
	Context          int              `json:"context"`
	Experts          int              `json:"experts"`
	ExpertsUsed      int              `json:"experts_used"`
	SharedExperts    int              `json:"shared_experts"`
	ExpertFFN        int              `json:"expert_ffn"`
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
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "inspect [FILE]",
		Short: "Describe a GGUF model: shape, experts, parameters and weight bytes (FILE defaults to -m)",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			path := a.modelPath
			if len(args) == 1 {
				path = args[0]
			}
			if err := a.checkModelPath(path); err != nil {
				return err
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
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object")
	return cmd
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
		Layers: in.Layers, Embedding: in.Embedding, Heads: in.Heads, HeadsKV: in.HeadsKV,
		Vocab: in.Vocab, Context: in.Context,
		Experts: in.Experts, ExpertsUsed: in.ExpertsUsed, SharedExperts: in.SharedExperts, ExpertFFN: in.ExpertFFN,
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
	row("layers", "%d", in.Layers)
	row("d_model", "%d", in.Embedding)
	row("heads", "%d (kv %d)", in.Heads, in.HeadsKV)
	row("vocab", "%d", in.Vocab)
	row("context", "%d", in.Context)
	if in.Experts > 0 {
		row("experts", "%d routed, top-%d, %d shared, expert ffn %d", in.Experts, in.ExpertsUsed, in.SharedExperts, in.ExpertFFN)
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
