// Package engine is commit-run's public Go API: open a GGUF model, create sessions, generate
// text with streaming tokens and cancellation, evaluate perplexity, and free everything.
//
// A Model is safe for concurrent use by many Sessions; a Session is used by one goroutine at a
// time. The command-line tool in cmd/commit-run uses nothing but this package.
//
// Inside, a forward pass (forward.go) runs each MoE block as select, route, place, compute and
// combine (moe.go). Where the experts live and when their weights move is a placement
// (placement.go): the model's own weights, or package offload's Offloader serving them from
// device slots or the host under one of its policies, one small type each. Timing-only runs
// (Options.TimingOnly, package shapes) go through the same passes on a simulated GPU that charges
// every kernel and copy without computing, so that every figure package bench reports comes
// from the code that would run on the card: it times runs with Model.Time (timing.go), as
// automatic placement (auto.go) times its candidates when a model does not fit its GPU. With Options.Parallel,
// the decode steps of sessions generating at the same time share one pass (batch.go).
package engine

import (
	"context"
	"slices"

	"github.com/commit-run/commit-run/cuda"
	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/grammar"
	"github.com/commit-run/commit-run/models"
	"github.com/commit-run/commit-run/multigpu"
	"github.com/commit-run/commit-run/sample"
	"github.com/commit-run/commit-run/sim"
)

// HostRates price the host's expert kernels for cpu-miss on a GPU, real or simulated: the
// rate a kernel reads its weights at for one token, and the rate of each further token's
// arithmetic. Measure this machine's with cpu.MeasureHostRates.
type HostRates = device.HostRates

// HostProfile describes a host's expert kernels as data, as a GPU profile describes a card:
// the embedded ones (Hosts) are the hosts of published measurements.
type HostProfile = sim.HostProfile

// LoadHost returns the embedded host profile name, or the one in a JSON file.
func LoadHost(name string) (*HostProfile, error) { return sim.LoadHost(name) }

// Hosts lists the embedded host profiles.
func Hosts() []string { return sim.Hosts() }

// GPURowWarpsChoices are the values Options.GPURowWarps takes besides 0.
func GPURowWarpsChoices() []int { return slices.Clone(cuda.RowWarpsChoices) }

// Options configure Open. The zero value runs on the CPU with every core, the model's own
// context length (capped by MaxContext) and an F16 KV cache, as llama.cpp does.
type Options struct {
	// Device selects where the model runs: "" or "cpu"; "cuda:N" for NVIDIA GPU N; "auto"
	// for cuda:0 when there is one and the CPU otherwise (see Model.DeviceNote); or
	// "sim:<profile>" for a simulated GPU (numbers computed on the CPU, time kept on the
	// modelled card's virtual timeline; see Devices and Model.Clock).
	Device string
	// CUDALibrary is the CUDA driver library to load; "" finds libcuda.so.1.
	CUDALibrary string
	// HostRates are the rates at which the host computes an expert from host memory
	// (cpu-miss): on a simulated device the modelled host's, on a GPU what cpu-miss weighs a
	// copy against. Zero rates take device.DefaultHostBandwidth and its siblings.
	HostRates HostRates
	// Threads is the number of compute threads; 0 uses every core.
	Threads int
	// ContextLength is the number of positions a session's KV cache holds; 0 uses the
	// model's training context, capped at DefaultMaxContext.
	ContextLength int
	// KVType is the KV cache element type: "f16" (default, as llama.cpp) or "f32".
	KVType string
	// Parallel is how many sequences decode at once (a server's concurrent requests, each on
	// its own session). Above 1, sessions generating at the same time compute their next
	// tokens in one forward pass (continuous batching, up to Parallel rows), and an offload
	// budget keeps room for Parallel KV caches before it sizes the expert slots. 0 or 1:
	// every session's passes are its own and the budget holds one KV cache.
	Parallel int
	// Progress, when set, is called while the model loads with the bytes done and the total.
	Progress func(done, total int64)
	// Offload, when set, keeps the routed experts in a host store and serves them from a
	// budgeted set of device slots (see OffloadOptions).
	Offload *OffloadOptions
	// Commit, when set, computes single-token passes with the Commit Router's predicted
	// experts and Output Weight Adjustment (see CommitOptions). Offloading with policy commit
	// and predictor "router" (its default) turns it on with its defaults.
	Commit *CommitOptions
	// Drop, when set, enforces a per-expert capacity on every batched MoE pass
	// (capacity-aware token drop; see DropOptions).
	Drop *DropOptions
	// EP, when set, spreads the experts over several devices of Device's kind (expert
	// parallelism; see EPOptions).
	EP *EPOptions
	// TimingOnly, on a simulated GPU, charges every kernel and copy of the model's passes to
	// the card's timeline without computing them or reading a weight, with the routing given
	// (see TimingOnlyOptions).
	TimingOnly *TimingOnlyOptions
	// AutoCommit lets automatic placement choose commit, which computes with predicted
	// experts and changes the output. Automatic placement runs on a GPU, real or simulated,
	// when neither Offload nor EP is set and the model does not fit the card (see
	// Model.AutoPlan); by default it chooses among the policies that keep the numbers.
	AutoCommit bool
	// AutoTrace is a routing trace of this model (commit-run trace record, predictor
	// collect) that automatic placement predicts with, its first tokens, instead of a
	// sample of the synthetic router: the model's own routing, skew and correlations. It is
	// read only when automatic placement runs.
	AutoTrace string
	// NoAuto turns automatic placement off: a model that does not fit the card is an error.
	NoAuto bool
	// NoGraphs launches a GPU's kernels as each pass enqueues them, instead of replaying a
	// decode step captured once as a CUDA graph: to rule the driver's graphs out, or to
	// measure what they save.
	NoGraphs bool
	// ProfileKernels times every kernel a CUDA GPU launches (Model.KernelProfile), between
	// timing events of its own; decode steps then launch their kernels eagerly, as NoGraphs.
	// For finding where the time goes: the events cost time of their own.
	ProfileKernels bool
	// GPURowWarps is the warps a CUDA GPU gives one row of a decoded token's integer
	// products (cuda.GPUOptions.RowWarps: 1, 2, 4 or 8; 0 is 1). Which is fastest depends on
	// the card; the float sums' order depends on it, so logits differ in their last bits
	// between values, never between runs.
	GPURowWarps int

	// unfused computes a pass on a GPU with one kernel per operation, as before the fused
	// kernels: the tests' reference for them.
	unfused bool
	// ungrouped computes a prompt's experts one by one where the device would group them
	// (device.GroupedExperts): the tests' reference for the grouped products.
	ungrouped bool

	// profile, when set, is the simulated GPU's profile (Device "sim:"), a real card's
	// described for automatic placement.
	profile *sim.Profile
}

// DropOptions are capacity-aware token drop in batched passes (multigpu.DropOptions): each
// expert computes at most its capacity of a pass's tokens, the others' choice of it
// contributes nothing.
type DropOptions = multigpu.DropOptions

// DefaultMaxContext caps the context length when Options.ContextLength is 0, so that a model
// trained for 128K positions does not reserve a huge KV cache by default.
const DefaultMaxContext = 4096

// MaxContextLength is the longest context Options.ContextLength may ask for.
const MaxContextLength = 1 << 22

// SamplerOptions choose the next token from a distribution (package sample). The zero value
// is greedy.
type SamplerOptions = sample.Options

// GenerateOptions control one call of Session.Generate or Session.Chat.
type GenerateOptions struct {
	// MaxTokens bounds the tokens generated; 0 = until EOS or the context is full.
	MaxTokens int
	Sampler   SamplerOptions
	// Stop strings end generation when they appear in the output; they are not returned.
	Stop []string
	// IgnoreEOS keeps generating past end-of-generation tokens.
	IgnoreEOS bool
	// OnToken, when set, receives each generated token as soon as it is sampled. Text holds
	// only complete UTF-8 and excludes stop strings; returning an error stops generation.
	OnToken func(Token) error
	// Logprobs asks for each generated token's log-probability under the model (its
	// distribution before any sampling option changes it) and for the TopLogprobs (0 to 20)
	// most likely tokens at its position: Token.Logprob and Result.Logprobs.
	Logprobs    bool
	TopLogprobs int
	// Grammar, when set, holds the output to a JSON value (package grammar): a token that
	// cannot continue it is never drawn, end-of-generation is allowed only once the value is
	// whole (even with IgnoreEOS, since nothing may follow), and generation stops as soon as
	// nothing may follow it (StopGrammar). MaxTokens still cuts the value short.
	Grammar *grammar.Grammar
	// GrammarTrigger makes Grammar lazy: the output is free until it holds this text, and
	// held to Grammar from the text's start on (a tool call in an answer that may also be
	// text: the grammar starts with the call's marker). "" holds it from the first token.
	GrammarTrigger string
}

// Token is one generated token.
type Token struct {
	ID   int32
	Text string
	// Logprob is set when GenerateOptions.Logprobs asked for it (and nil on the text that a
	// stop string held back, which has no token of its own).
	Logprob *Logprob
}

// Logprob is a generated token's log-probability and the most likely tokens at its position,
// most likely first (package sample).
type Logprob = sample.Logprob

// TokenLogprob is one token's log-probability.
type TokenLogprob = sample.TokenLogprob

// StopReason says why generation ended.
type StopReason string

// The reasons generation stops.
const (
	StopEOS       StopReason = "eos"
	StopString    StopReason = "stop"
	StopMaxTokens StopReason = "length"
	StopContext   StopReason = "context"
	// StopGrammar: GenerateOptions.Grammar's value is whole and nothing may follow it.
	StopGrammar StopReason = "grammar"
)

// Result summarises one generation.
type Result struct {
	Tokens []int32
	// Logprobs are Tokens' log-probabilities, when GenerateOptions.Logprobs asked for them.
	Logprobs     []Logprob
	Text         string
	Reason       StopReason
	PromptTokens int
	// CachedTokens are the prompt's first tokens the session's KV cache held already, which
	// were not evaluated again (prefix reuse).
	CachedTokens int
	// PromptDuration and DecodeDuration are wall times in seconds of the prompt pass and of
	// all decode steps.
	PromptSeconds float64
	DecodeSeconds float64
}

// Message is one turn of a chat.
type Message struct {
	Role    string // "system", "user", "assistant" or "tool"
	Content string
	// ToolCalls are the calls an assistant turn made (see ChatOptions).
	ToolCalls []ToolCall
	// ToolCallID and Name say which call a tool turn answers, and its function.
	ToolCallID, Name string
}

// Info describes an opened model (see Model.Info and Inspect): its file's metadata, its
// hyper-parameters and routing, and its weights' layout (models.Info).
type Info = models.Info

// KeyChatStop is the GGUF key of Info.ChatStop: an array of strings.
const KeyChatStop = models.KeyChatStop

// PerplexityResult is the outcome of Model.Perplexity.
type PerplexityResult struct {
	Tokens      int     // tokens scored
	Bytes       int     // UTF-8 bytes of the scored text
	Perplexity  float64 // exp(mean negative log-likelihood per token)
	BitsPerByte float64
	NLL         float64 // total negative log-likelihood in nats
}

// The methods below are the whole surface; their bodies live in the other files of the package.
var (
	_ func(string, Options) (*Model, error)                                       = Open
	_ func(string) (*Info, error)                                                 = Inspect
	_ func(*Model) Info                                                           = (*Model).Info
	_ func(*Model, string, bool) ([]int32, error)                                 = (*Model).Tokenize
	_ func(*Model, []int32) string                                                = (*Model).Detokenize
	_ func(*Model, []Message) ([]int32, error)                                    = (*Model).ChatTokens
	_ func(string) error                                                          = CheckUTF8
	_ func(*Model) (*Session, error)                                              = (*Model).NewSession
	_ func(*Model, context.Context, string, int) (PerplexityResult, error)        = (*Model).Perplexity
	_ func(*Model) error                                                          = (*Model).Close
	_ func(*Session, context.Context, []int32, GenerateOptions) (Result, error)   = (*Session).Generate
	_ func(*Session, context.Context, []Message, GenerateOptions) (Result, error) = (*Session).Chat
	_ func(*Session, context.Context, []int32, func(int, []float32) error) error  = (*Session).Probs
	_ func(*Session)                                                              = (*Session).Reset
	_ func(*Session) error                                                        = (*Session).Close
)
