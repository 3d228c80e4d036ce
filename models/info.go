package models

import "strings"

// Info describes a model: its file's metadata, the hyper-parameters and routing of its
// architecture, and its weights' layout (Describe; the engine's Info and Inspect).
type Info struct {
	Path         string
	Architecture string
	Name         string
	Layers       int
	Embedding    int
	Vocab        int
	Context      int // training context from the metadata
	Heads        int
	HeadsKV      int
	// MoELayers are the block indices of the layers that route over experts.
	MoELayers []int
	// Experts is the routed expert count (0 for a dense model); ExpertsUsed is top-k.
	Experts       int
	ExpertsUsed   int
	SharedExperts int
	ExpertFFN     int
	// Routing is the first MoE layer's choice and weighting of experts: the gating
	// ("softmax", "sigmoid", "softmax of the top-k"), whether a selection bias
	// (exp_probs_b) steers the choice, the expert groups it is limited to (0: none), and
	// the weights' renormalisation and scale (0: none).
	Gating                         string
	SelectionBias                  bool
	ExpertGroups, ExpertGroupsUsed int
	ExpertWeightsNorm              bool
	ExpertWeightsScale             float32
	// RouterBias says the router's logits have a bias (gpt-oss's ffn_gate_inp.bias), which
	// steers the choice and the weights alike; ExpertBiases that the experts' products have
	// biases; Activation is the experts' ("swiglu", or gpt-oss's clamped "swiglu-oai").
	RouterBias, ExpertBiases bool
	Activation               string
	// SlidingWindow is the positions a sliding-window layer attends to (0: none) and
	// SlidingLayers how many layers have it; AttentionSinks says the heads have sink logits
	// that take part of the softmax (gpt-oss).
	SlidingWindow, SlidingLayers int
	AttentionSinks               bool
	// DeltaNetLayers are the layers of gated DeltaNet linear attention (qwen35moe), which
	// keep a recurrent state per sequence instead of keys and values; the others attend
	// over every position. Their queries and keys have DeltaNetKHeads heads and their values
	// DeltaNetVHeads, all of DeltaNetHeadDim, after a causal convolution of DeltaNetConvK
	// taps; RecurrentStateBytes is one sequence's state of every such layer, its
	// convolution's last inputs and its recurrent state, in float32.
	DeltaNetLayers                                                 int
	DeltaNetKHeads, DeltaNetVHeads, DeltaNetHeadDim, DeltaNetConvK int
	RecurrentStateBytes                                            int64
	// GatedAttentionLayers counts the full-attention layers whose output is multiplied by a
	// sigmoid gate that the query projection computes beside the queries (qwen35moe).
	GatedAttentionLayers int
	Parameters           int64
	// NextN and SkippedParameters are the blocks after Layers the file holds but no pass
	// runs (GLM's multi-token prediction) and their weights, which no other count includes.
	NextN             int
	SkippedParameters int64
	// ExpertParameters and ExpertBytes count routed-expert weights; the rest are non-expert.
	ExpertParameters int64
	ExpertBytes      int64
	NonExpertBytes   int64
	// TensorTypes counts tensors by ggml type name.
	TensorTypes map[string]int
	// TensorTypeBytes sums bytes by ggml type name.
	TensorTypeBytes map[string]int64
	ChatTemplate    string
	// ChatStop are stop strings the model's file asks chats to use (GGUF key
	// general.commit_run.chat_stop), for models that never learnt to emit EOS; the engine's
	// chats add them to their stop strings.
	ChatStop []string
}

// KeyChatStop is the GGUF key of Info.ChatStop: an array of strings.
const KeyChatStop = "general.commit_run.chat_stop"

// Describe describes the model m loaded from f.
func Describe(f *File, m *Model) Info {
	c := m.Config
	info := Info{
		Path: f.Path, Architecture: c.Arch, Name: f.KV.String("general.name"),
		Layers: c.Layers, NextN: c.NextN, Embedding: c.Embd, Vocab: c.Vocab, Context: c.ContextLen,
		Heads: c.Heads[0], HeadsKV: c.HeadsKV[0],
		Experts: c.Experts, ExpertsUsed: c.ExpertsUsed, SharedExperts: c.Shared, ExpertFFN: c.ExpertFFN,
		TensorTypes: map[string]int{}, TensorTypeBytes: map[string]int64{},
		ChatTemplate: f.KV.String("tokenizer.chat_template"),
		ChatStop:     f.KV.Strings(KeyChatStop),
	}
	for i, l := range m.Layers {
		if l.MoE != nil {
			info.MoELayers = append(info.MoELayers, i)
		}
		if l.MoE != nil && l.MoE.Shared != nil && info.SharedExperts == 0 {
			info.SharedExperts = 1
		}
		if moe := l.MoE; moe != nil && info.Gating == "" {
			info.Gating = map[Gating]string{GatingSoftmax: "softmax", GatingSigmoid: "sigmoid",
				GatingSoftmaxWeight: "softmax of the top-k"}[moe.Gating]
			info.SelectionBias = moe.SelectionBias != nil
			info.ExpertGroups, info.ExpertGroupsUsed = moe.Groups, moe.GroupsUsed
			info.ExpertWeightsNorm, info.ExpertWeightsScale = moe.NormWeights, moe.WeightsScale
			info.RouterBias, info.ExpertBiases = moe.RouterBias != nil, moe.GateBias != nil || moe.UpBias != nil || moe.DownBias != nil
			info.Activation = "swiglu"
			if moe.OAI != nil {
				info.Activation = "swiglu-oai"
			}
		}
		if a, ok := l.Attn.(*StdAttention); ok {
			if a.Window > 0 {
				info.SlidingWindow = a.Window
				info.SlidingLayers++
			}
			info.AttentionSinks = info.AttentionSinks || a.Sinks != nil
			if a.OutGate {
				info.GatedAttentionLayers++
			}
		}
		if d, ok := l.Attn.(*DeltaNet); ok {
			info.DeltaNetLayers++
			info.DeltaNetKHeads, info.DeltaNetVHeads, info.DeltaNetHeadDim, info.DeltaNetConvK = d.KHeads, d.VHeads, d.HeadDim, d.ConvK
		}
		if r, ok := l.Attn.(Recurrent); ok {
			conv, state := r.StateDims()
			info.RecurrentStateBytes += int64(conv+state) * 4
		}
	}
	for _, t := range f.Tensors {
		if c.Skipped(t.Name) {
			// Held by the file, never run: not the model's parameters nor memory it needs.
			info.SkippedParameters += t.Elements()
			continue
		}
		info.Parameters += t.Elements()
		info.TensorTypes[t.Type.String()]++
		info.TensorTypeBytes[t.Type.String()] += t.Bytes()
		if strings.HasSuffix(t.Name, "_exps.weight") {
			info.ExpertParameters += t.Elements()
			info.ExpertBytes += t.Bytes()
		} else {
			info.NonExpertBytes += t.Bytes()
		}
	}
	return info
}
