package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/multigpu"
	"github.com/commit-run/commit-run/offload"
	"github.com/commit-run/commit-run/owa"
)

// defaultModel is the small model bundled with the repository, so that `commit-run generate`
// works from a checkout with no flags at all.
const defaultModel = "models/testdata/tinymoe-qwen2moe.gguf"

// exitInterrupted is the conventional status of a process stopped by SIGINT (128 + 2).
const exitInterrupted = 130

// app holds one invocation's streams and global flags. Each run builds a fresh one, so that
// tests can execute the command tree many times in one process.
type app struct {
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer

	modelPath string
	threads   int
	ctxLen    int
	kvType    string
	device    string
	cudaLib   string
	noGraphs  bool
	rowWarps  int
	// Offloading: set by --gpu-mem; the policy, eviction and predictor refine it.
	gpuMem, policy, eviction, predictor, host, hostBW, hostFLOPS, autoTrace string
	cpuMoELayers                                                            int
	autoCommit                                                              bool
	// Committed routing: the Commit Router file and the OWA override.
	predictorFile, owaSpec string
	crossToken             bool
	// Capacity-aware token drop in batched passes.
	capacityFactor float64
	dropMetric     string
	expandedDrop   bool
	deviceCapacity bool
	dropDevices    int
	// Expert parallelism: --ep devices, --ep-policy, --link-bw, --harmoeny-q, --ep-transport,
	// --nccl-lib.
	epDevices, harmoenyQ int
	epPolicy, linkBW     string
	epTransport, ncclLib string
	epRank               int
	epRendezvous         string
	// MACS's semantic rerouting: --macs-eta and the --macs-calibration text.
	macsEta         float64
	macsCalibration string
	profMode        string
	profDir         string
	stopProf        func()
	interrupts      *interrupts
}

// run executes the command line args and returns the process exit status. sig delivers
// Ctrl-C / SIGTERM; it may be nil (tests).
func run(args []string, stdin io.Reader, stdout, stderr io.Writer, sig <-chan os.Signal) int {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a := &app{stdin: stdin, stdout: stdout, stderr: stderr, stopProf: func() {}}
	a.interrupts = newInterrupts(cancel, func() {
		// A second Ctrl-C while the first is still unwinding (a long engine call that does not
		// check its context) must still leave a usable profile behind.
		a.stopProf()
		os.Exit(exitInterrupted)
	})
	if sig != nil {
		done := make(chan struct{})
		defer close(done)
		go a.interrupts.serve(sig, done)
	}

	root := a.rootCmd()
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	// Stop the profile on every path out, errors and Ctrl-C included, so the file is complete.
	a.stopProf()
	if err == nil {
		return 0
	}
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		fmt.Fprintln(stderr, "commit-run: interrupted")
		return exitInterrupted
	}
	// One line: multi-line engine errors would bury the cause under noise.
	fmt.Fprintln(stderr, "commit-run: "+strings.ReplaceAll(err.Error(), "\n", "; "))
	return 1
}

func (a *app) rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "commit-run",
		Short: "Run Mixture-of-Experts language models from GGUF files",
		Long: "commit-run runs Mixture-of-Experts language models stored as GGUF files.\n" +
			"Without -m it uses the bundled model " + defaultModel + ", a tiny MoE trained on War and Peace.",
		// Runtime errors (missing file, engine failure) are not usage mistakes: print only the
		// error, once, from run.
		SilenceUsage:      true,
		SilenceErrors:     true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error { return a.setup() },
	}
	// Cobra's default for a bad flag value is the error plus the whole usage text; keep it to
	// one line with a pointer to --help.
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return fmt.Errorf("%v (see %s --help)", err, cmd.CommandPath())
	})
	// Shell completion is not worth a top-level entry in a tool with five commands.
	root.CompletionOptions.HiddenDefaultCmd = true
	pf := root.PersistentFlags()
	pf.StringVarP(&a.modelPath, "model", "m", defaultModel, "GGUF model `FILE`")
	pf.IntVar(&a.threads, "threads", 0, "compute threads (0 = all cores)")
	pf.IntVar(&a.ctxLen, "ctx", 0, fmt.Sprintf("context length in tokens (0 = the model's, at most %d)", engine.DefaultMaxContext))
	pf.StringVar(&a.kvType, "kv-type", "f16", "KV cache element type: f16 or f32")
	pf.StringVar(&a.device, "device", "auto", "device to run on: auto (cuda:0 if the driver sees a GPU, else the CPU, saying which), cpu, cuda:N (NVIDIA GPU N; see commit-run devices), or sim:<profile> for a simulated GPU ("+strings.Join(simDevices(), ", ")+", or a profile JSON file); on a GPU a model that does not fit is placed automatically unless --gpu-mem or --policy says how")
	pf.BoolVar(&a.autoCommit, "auto-commit", false, "let automatic placement choose commit, which computes with predicted experts and changes the output")
	pf.StringVar(&a.autoTrace, "auto-trace", "", "a routing `TRACE` of the model (trace record, predictor collect) that automatic placement predicts with instead of the synthetic router")
	pf.StringVar(&a.cudaLib, "cuda-lib", "", "the CUDA driver library `FILE` (default: libcuda.so.1 from the loader's path)")
	pf.BoolVar(&a.noGraphs, "no-graphs", false, "on a GPU, launch each decoded token's kernels one by one instead of replaying the token as a CUDA graph (to rule the driver's graphs out, or to measure what they save)")
	pf.IntVar(&a.rowWarps, "gpu-row-warps", 1, "on a GPU, the warps that share one row of a decoded token's integer products: 1, 2, 4 or 8 (which is fastest depends on the card; logits differ between values in their last bits)")
	pf.StringVar(&a.gpuMem, "gpu-mem", "", "offload the routed experts to host memory within this device memory `SIZE`, e.g. 12GiB")
	pf.StringVar(&a.policy, "policy", "", "expert policy with --gpu-mem: ondemand (default), prefetch, commit (computes with predicted experts: changes the output), cpu-miss, hot (the most chosen experts on the device, the host computes the rest), static (llama.cpp's CPU/GPU split, see --cpu-moe-layers) or static-cache (static with the host layers' experts cached in the spare device memory); bench takes a comma-separated list; commit without --gpu-mem computes with the Commit Router's experts without offloading (to measure quality)")
	pf.StringVar(&a.eviction, "eviction", "lru", "expert cache eviction: lru or lfu")
	pf.StringVar(&a.predictor, "predictor", "", "next-layer prediction for prefetch and commit: router (the trained Commit Router, commit's default), prev-token (prefetch's default) or frequency; commit also oracle (the router's own choice); bench --shape also accuracy=P[,first=Q] (default accuracy=0.8,first=0.45)")
	pf.StringVar(&a.predictorFile, "predictor-file", "", "Commit Router `FILE` (default: the model's sidecar, MODEL.commit-router.gguf)")
	pf.BoolVar(&a.crossToken, "cross-token", false, "under commit, also commit each token's first MoE layer to the prediction from the previous token (CommitMoE's whole pipeline; costs quality on the bundled models)")
	pf.StringVar(&a.owaSpec, "owa", "", "Output Weight Adjustment under commit: the model's defaults, off, neutral (alpha1 = alpha2 = 1), or overrides a1=F,a2=F,range=MIN-MAX")
	pf.Float64Var(&a.capacityFactor, "capacity-factor", 0, "capacity-aware token drop in batched passes (prefill, eval ppl): each expert computes at most FACTOR x the mean load of a batch (0 = off)")
	pf.StringVar(&a.dropMetric, "drop-metric", "score", "which tokens an expert over capacity keeps: score, order, reverse or random")
	pf.BoolVar(&a.expandedDrop, "expanded-drop", false, "with --capacity-factor: expanded drop, each token also offered to the experts of its own device (see --drop-devices)")
	pf.BoolVar(&a.deviceCapacity, "device-capacity", false, "with --capacity-factor: cap each device's experts together (device-level capacity) instead of each expert")
	pf.IntVar(&a.dropDevices, "drop-devices", 1, "with --capacity-factor: the expert-parallel devices token drop plans for, experts placed round-robin, each device capping its share of the batch")
	pf.IntVar(&a.epDevices, "ep", 0, "expert parallelism: spread the experts over `N` devices of --device's kind, on CUDA one GPU per rank from --device's (eval ppl spreads its windows over them; a chat's tokens live on the first); bench --ep compares --ep-policy planners")
	pf.StringVar(&a.epTransport, "ep-transport", "", "with --ep: what moves the tokens between the devices: nccl (CUDA GPUs), local (in-process copies through host memory), or auto (default: NCCL on GPUs when it loads, else local)")
	pf.StringVar(&a.ncclLib, "nccl-lib", "", "with --ep on CUDA: the NCCL library `FILE` (default: libnccl.so.2 from the loader's path)")
	pf.StringVar(&a.epRendezvous, "ep-rendezvous", "", "with --ep N: run one rank per process, on this machine or several; rank 0 listens at `HOST:PORT`, the others connect (start rank 0 with any command, the others with ep-serve)")
	pf.IntVar(&a.epRank, "ep-rank", 0, "with --ep-rendezvous: this process's rank, 0 to N-1, on --device's GPU")
	pf.StringVar(&a.epPolicy, "ep-policy", "", "with --ep: the planner of each MoE layer's batch, "+strings.Join(engine.EPPolicies(), ", ")+" (default round-robin; bench takes a comma-separated list, default all); the capacity-aware ones use --capacity-factor (default 1.5) and --drop-metric")
	pf.Float64Var(&a.macsEta, "macs-eta", 0, "with --ep-policy macs or macs-expanded: the weight of semantic affinity against the gating score when MACS reroutes a token (eq. 10), 0 to 1; needs --macs-calibration")
	pf.StringVar(&a.macsCalibration, "macs-calibration", "", "with --macs-eta: a text `FILE` whose routing gives each expert its centroid (its first 4096 tokens, run on the CPU at start)")
	pf.StringVar(&a.linkBW, "link-bw", "", "with --ep on simulated devices: each device's all-to-all bandwidth, e.g. 50GB (default: the profile's PCIe rate)")
	pf.IntVar(&a.harmoenyQ, "harmoeny-q", 0, "with --ep: HarMoEny's token threshold q, the fewest tokens worth moving to a device that must fetch the expert (0: eq. 4 from the profile's FLOPS and PCIe rate; 150 on the CPU)")
	pf.IntVar(&a.cpuMoELayers, "cpu-moe-layers", 0, "llama.cpp's split, as its --n-cpu-moe N: the routed experts of the first `N` MoE layers stay in host memory and the host computes them, the others stay on the device; alone it means --policy static in the card's whole memory (--gpu-mem to give less, --policy static-cache for its cache); bench adds both to its policies when N is given")
	pf.StringVar(&a.host, "host", "", "GPUs, real or simulated: the host's rates for the experts it computes (cpu-miss, static) from a host profile, "+strings.Join(engine.Hosts(), ", ")+", or a JSON `FILE` like them; --host-bw and --host-flops override its rates (default: measured on this machine)")
	pf.StringVar(&a.host, "host-profile", "", "the same as --host, for serve, whose --host is the address it listens on")
	pf.StringVar(&a.hostBW, "host-bw", "", "GPUs, real or simulated: the rate the host reads a missed expert's weights at when it computes the expert itself (cpu-miss), e.g. 20GB (default: measured on this machine)")
	pf.StringVar(&a.hostFLOPS, "host-flops", "", "GPUs, real or simulated: the rate of the arithmetic each further token of a batch adds to such a host expert, e.g. 150G (default: measured on this machine)")
	pf.StringVar(&a.profMode, "profile", "", "write a Go profile: cpu or mem")
	pf.StringVar(&a.profDir, "profile-dir", ".", "`DIR` for the --profile output (cpu.pprof or mem.pprof)")

	root.AddCommand(a.chatCmd(), a.generateCmd(), a.serveCmd(), a.inspectCmd(), a.logitsCmd(), a.evalCmd(), a.traceCmd(), a.benchCmd(), a.predictorCmd(), a.devicesCmd(),
		a.epServeCmd())
	return root
}

// maxThreads and maxCtx bound the global numeric flags: anything above is a typo, and the
// engine would otherwise try to spawn that many goroutines or reserve that much KV cache.
const (
	maxThreads = 4096
	maxCtx     = engine.MaxContextLength
)

// setup validates the global flags and starts profiling; it runs before every subcommand.
func (a *app) setup() error {
	if a.threads < 0 || a.threads > maxThreads {
		return fmt.Errorf("--threads %d: want 0 (all cores) to %d", a.threads, maxThreads)
	}
	if a.ctxLen < 0 || a.ctxLen > maxCtx {
		return fmt.Errorf("--ctx %d: want 0 (the model's) to %d", a.ctxLen, maxCtx)
	}
	switch a.kvType {
	case "f16", "f32":
	default:
		return fmt.Errorf("--kv-type %q: want f16 or f32", a.kvType)
	}
	if w := engine.GPURowWarpsChoices(); !slices.Contains(w, a.rowWarps) {
		return fmt.Errorf("--gpu-row-warps %d: want one of %v", a.rowWarps, w)
	}
	stop, err := startProfile(a.profMode, a.profDir, a.stderr)
	if err != nil {
		return err
	}
	a.stopProf = stop
	return nil
}

// checkModelPath turns the engine's "no such file" into advice on how to choose a model.
func (a *app) checkModelPath(path string) error {
	if _, err := os.Stat(path); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			if path == defaultModel {
				return fmt.Errorf("no model at %s (the default, relative to the working directory); pass one with -m FILE", path)
			}
			return fmt.Errorf("model file %s does not exist; pass a GGUF file with -m FILE", path)
		}
		return err
	}
	return nil
}

// openModel opens the -m model with the global options, drawing a load progress bar on a
// terminal.
func (a *app) openModel() (*engine.Model, error) {
	opts, err := a.engineOptions(a.device, a.runPolicy())
	if err != nil {
		return nil, err
	}
	return a.openModelWith(opts)
}

// plainOptions are the options of the global flags that say how to run the model, without
// offloading or committed routing: for the commands that study the router itself.
func (a *app) plainOptions() engine.Options {
	return a.baseOptions(a.device)
}

// baseOptions are the options of the global flags that say where and how to compute.
func (a *app) baseOptions(device string) engine.Options {
	return engine.Options{Device: device, CUDALibrary: a.cudaLib, NoGraphs: a.noGraphs, GPURowWarps: a.rowWarps, Threads: a.threads,
		ContextLength: a.ctxLen, KVType: a.kvType, AutoCommit: a.autoCommit, AutoTrace: a.autoTrace}
}

// openModelWith opens the -m model with opts, drawing a load progress bar on a terminal.
func (a *app) openModelWith(opts engine.Options) (*engine.Model, error) {
	if err := a.checkModelPath(a.modelPath); err != nil {
		return nil, err
	}
	var bar *progressBar
	if isTerminal(a.stderr) {
		bar = newProgressBar(a.stderr, "loading")
		opts.Progress = bar.update
	}
	m, err := engine.Open(a.modelPath, opts)
	if bar != nil {
		bar.finish()
	}
	if err != nil {
		return nil, openError(a.modelPath, err)
	}
	if note := m.DeviceNote(); note != "" {
		fmt.Fprintln(a.stderr, "commit-run: "+note)
	}
	return m, nil
}

// openError says that opening path failed, naming the file once: the engine's errors about
// the file itself begin with its path already.
func openError(path string, err error) error {
	if msg, ok := strings.CutPrefix(err.Error(), path+": "); ok {
		return wrapped{"open " + path + ": " + msg, err}
	}
	return fmt.Errorf("open %s: %w", path, err)
}

// wrapped is an error with a message of its own that still unwraps to err.
type wrapped struct {
	msg string
	err error
}

func (w wrapped) Error() string { return w.msg }
func (w wrapped) Unwrap() error { return w.err }

// engineOptions are the engine options the global flags ask for, offloading with policy
// included (bench passes "" and compares its list of policies itself).
func (a *app) engineOptions(device, policy string) (engine.Options, error) {
	opts := a.baseOptions(device)
	if err := a.epOrDropOptions(&opts); err != nil {
		return opts, err
	}
	var err error
	if opts.HostRates, _, err = a.hostRates(); err != nil {
		return opts, err
	}
	learnt := a.predictor == "" || a.predictor == "router"
	// A value that cannot be right is named first, before anything it depends on.
	if err := a.checkOffloadSyntax(); err != nil {
		return opts, err
	}
	if a.gpuMem == "" && !a.splitAlone() {
		err = a.residentOptions(&opts, policy, learnt)
	} else {
		err = a.offloadOptions(&opts, device, policy, learnt)
	}
	return opts, err
}

// epOrDropOptions sets how the experts share a batch's tokens: spread over --ep devices, or
// on one device with capacity-aware token drop. Expert parallelism rules offloading out.
func (a *app) epOrDropOptions(opts *engine.Options) error {
	var err error
	if opts.EP, err = a.epOptions(a.epPolicy); err != nil {
		return err
	}
	if opts.EP != nil {
		if err := a.macsFlagsFit([]string{a.epPolicy}); err != nil {
			return err
		}
	}
	if opts.EP == nil {
		if opts.Drop, err = a.dropOptions(); err != nil {
			return err
		}
	} else if a.gpuMem != "" || a.policy != "" {
		return fmt.Errorf("--gpu-mem and --policy offload experts to host memory; --ep spreads them over devices (see --ep-policy)")
	}
	return nil
}

// checkOffloadSyntax refuses an --owa or a --policy that no other flag could make right.
func (a *app) checkOffloadSyntax() error {
	if err := owa.Syntax(a.owaSpec); err != nil {
		return fmt.Errorf("--owa: %w", err)
	}
	for _, p := range strings.Split(a.policy, ",") {
		if p = strings.TrimSpace(p); p != "" {
			if _, err := offload.ParsePolicy(p); err != nil {
				return fmt.Errorf("--policy: %w", err)
			}
		}
	}
	return nil
}

// runPolicy is the policy a command that runs one takes: --policy, or llama.cpp's split
// where --cpu-moe-layers alone asks for it, as llama.cpp's --n-cpu-moe does.
func (a *app) runPolicy() string {
	if a.policy == "" && a.cpuMoELayers != 0 {
		return offload.Static.String()
	}
	return a.policy
}

// splitAlone says whether llama.cpp's split is asked for without --gpu-mem (--cpu-moe-layers,
// or --policy static or static-cache): then the budget is the card's whole memory, as
// llama.cpp's --n-cpu-moe fills the card, where other policies need a budget to size their
// cache by.
func (a *app) splitAlone() bool {
	if a.gpuMem != "" {
		return false
	}
	if a.policy == "" {
		return a.cpuMoELayers != 0
	}
	return !slices.ContainsFunc(strings.Split(a.policy, ","), func(p string) bool {
		q, err := offload.ParsePolicy(p)
		return err != nil || !q.Split()
	})
}

// residentOptions are the options with every expert in device memory (no --gpu-mem): then
// only --policy commit means something, and the other offloading flags are mistakes.
func (a *app) residentOptions(opts *engine.Options, policy string, learnt bool) error {
	if policy == "commit" && learnt {
		// Committed routing without offloading: the numbers of commit, for quality.
		opts.Commit = a.commitOptions()
		return nil
	}
	for _, f := range []struct{ name, v string }{{"policy", a.policy}, {"predictor", a.predictor}, {"predictor-file", a.predictorFile}, {"owa", a.owaSpec}} {
		if f.v != "" {
			return fmt.Errorf("--%s chooses how offloaded experts are served: pass a device memory budget with --gpu-mem (or --policy commit alone, to compute with the Commit Router's experts without offloading)", f.name)
		}
	}
	return nil
}

// offloadOptions sets the offloading that --gpu-mem, or llama.cpp's split alone, asks for:
// the budget, the policy and its predictor, the split, and the host's rates where the policy
// weighs them.
func (a *app) offloadOptions(opts *engine.Options, device, policy string, learnt bool) error {
	if (a.predictorFile != "" || a.owaSpec != "" || a.crossToken) && !(learnt && (policy == "commit" || policy == "")) {
		return fmt.Errorf("--predictor-file, --owa and --cross-token configure the Commit Router: use them with --policy commit and --predictor router")
	}
	o := &engine.OffloadOptions{Predictor: a.predictor, HostLayers: a.cpuMoELayers}
	if a.gpuMem != "" { // else splitAlone: 0, the card's memory (engine.OffloadOptions)
		mem, err := parseBytes(a.gpuMem)
		if err != nil {
			return fmt.Errorf("--gpu-mem: %w", err)
		}
		o.GPUMem = int64(mem)
	}
	var err error
	if policy != "" {
		if o.Policy, err = offload.ParsePolicy(policy); err != nil {
			return fmt.Errorf("--policy: %w", err)
		}
	}
	if o.Eviction, err = offload.ParseEviction(a.eviction); err != nil {
		return fmt.Errorf("--eviction: %w", err)
	}
	opts.Offload = o
	if o.Policy == offload.Commit && learnt {
		opts.Commit = a.commitOptions()
	}
	if a.cpuMoELayers != 0 && a.policy != "" && !slices.ContainsFunc(strings.Split(a.policy, ","), func(p string) bool {
		q, err := offload.ParsePolicy(p)
		return err == nil && q.Split()
	}) {
		return fmt.Errorf("--cpu-moe-layers is llama.cpp's split's: pass --policy static or static-cache")
	}
	if !o.Policy.Split() {
		o.HostLayers = 0 // bench gives it to static alone
	}
	if weighsHost(device) && o.Policy.UsesHost() {
		opts.HostRates = measureHostRates(opts.HostRates)
	}
	return nil
}

// weighsHost says whether cpu-miss on device weighs the host's rate against a copy's (a GPU,
// real or simulated), so that the rate is worth measuring; the CPU computes every miss.
func weighsHost(device string) bool {
	return device != "" && device != "cpu"
}

// epOptions are the expert-parallel options of the global flags with one planner (nil: one
// device).
func (a *app) epOptions(policy string) (*engine.EPOptions, error) {
	if a.epDevices == 0 {
		for _, f := range []struct{ name, v string }{{"ep-policy", a.epPolicy}, {"link-bw", a.linkBW}, {"ep-transport", a.epTransport}, {"nccl-lib", a.ncclLib}, {"ep-rendezvous", a.epRendezvous}} {
			if f.v != "" {
				return nil, fmt.Errorf("--%s applies to expert parallelism: pass --ep N", f.name)
			}
		}
		if a.harmoenyQ != 0 {
			return nil, fmt.Errorf("--harmoeny-q applies to expert parallelism: pass --ep N")
		}
		if a.epRank != 0 {
			return nil, fmt.Errorf("--ep-rank applies to expert parallelism over processes: pass --ep N and --ep-rendezvous")
		}
		if a.macsEta != 0 || a.macsCalibration != "" {
			return nil, fmt.Errorf("--macs-eta and --macs-calibration apply to expert parallelism: pass --ep N and --ep-policy macs or macs-expanded")
		}
		return nil, nil
	}
	if a.epDevices < 2 || a.epDevices > 1024 {
		return nil, fmt.Errorf("--ep %d: want 2 to 1024 devices (0 = one device)", a.epDevices)
	}
	if a.expandedDrop || a.deviceCapacity || a.dropDevices != 1 {
		return nil, fmt.Errorf("--expanded-drop, --device-capacity and --drop-devices plan token drop on one device; with --ep choose --ep-policy expanded-drop, token-drop/device or expanded-drop/device")
	}
	if strings.Contains(policy, ",") {
		return nil, fmt.Errorf("--ep-policy %q: one planner at a time (bench compares several)", policy)
	}
	if !(a.capacityFactor >= 0) || a.capacityFactor > 1e6 {
		return nil, fmt.Errorf("--capacity-factor %v: want a factor above 0 (0 = 1.5 under --ep)", a.capacityFactor)
	}
	if a.harmoenyQ < 0 {
		return nil, fmt.Errorf("--harmoeny-q %d: want 0 (eq. 4) or more tokens", a.harmoenyQ)
	}
	m, err := multigpu.ParseDropMetric(a.dropMetric)
	if err != nil {
		return nil, fmt.Errorf("--drop-metric: %w", err)
	}
	o := &engine.EPOptions{Devices: a.epDevices, Policy: policy, Gamma: a.capacityFactor, Metric: m, Seed: 1, HarMoEnyThreshold: a.harmoenyQ,
		Transport: a.epTransport, NCCLLibrary: a.ncclLib, Rendezvous: a.epRendezvous, Rank: a.epRank}
	if a.epRank != 0 && a.epRendezvous == "" {
		return nil, fmt.Errorf("--ep-rank %d: pass --ep-rendezvous HOST:PORT too (rank 0's address)", a.epRank)
	}
	if a.epRendezvous != "" && (a.epRank < 0 || a.epRank >= a.epDevices) {
		return nil, fmt.Errorf("--ep-rank %d: want 0 to %d", a.epRank, a.epDevices-1)
	}
	if a.linkBW != "" {
		if o.LinkBandwidth, err = parseBytes(a.linkBW); err != nil {
			return nil, fmt.Errorf("--link-bw: %w", err)
		}
	}
	if strings.HasPrefix(strings.TrimSpace(policy), "macs") {
		if err := a.macsOptions(o); err != nil {
			return nil, err
		}
	}
	return o, nil
}

// macsOptions sets o's MACS calibration from --macs-eta and --macs-calibration.
func (a *app) macsOptions(o *engine.EPOptions) error {
	if !(a.macsEta >= 0 && a.macsEta <= 1) {
		return fmt.Errorf("--macs-eta %v: want 0 to 1", a.macsEta)
	}
	if (a.macsEta > 0) != (a.macsCalibration != "") {
		return fmt.Errorf("--macs-eta weighs the affinity to expert centroids that --macs-calibration gives: pass both")
	}
	o.MACSEta = a.macsEta
	if a.macsCalibration != "" {
		data, err := os.ReadFile(a.macsCalibration)
		if err != nil {
			return fmt.Errorf("--macs-calibration: %w", err)
		}
		o.MACSCalibration = string(data)
	}
	return nil
}

// macsFlagsFit says why --macs-eta and --macs-calibration do not fit planners, when they are
// given and none of planners is MACS's.
func (a *app) macsFlagsFit(planners []string) error {
	if a.macsEta == 0 && a.macsCalibration == "" {
		return nil
	}
	for _, p := range planners {
		if strings.HasPrefix(strings.TrimSpace(p), "macs") {
			return nil
		}
	}
	return fmt.Errorf("--macs-eta and --macs-calibration apply to --ep-policy macs or macs-expanded")
}

// dropOptions are the token drop options of the global flags (nil: off).
func (a *app) dropOptions() (*engine.DropOptions, error) {
	m, err := multigpu.ParseDropMetric(a.dropMetric)
	if err != nil {
		return nil, fmt.Errorf("--drop-metric: %w", err)
	}
	switch {
	case a.capacityFactor == 0:
		if a.expandedDrop || a.deviceCapacity || a.dropDevices != 1 {
			return nil, fmt.Errorf("--expanded-drop, --device-capacity and --drop-devices shape capacity-aware token drop: pass --capacity-factor too")
		}
		return nil, nil
	case !(a.capacityFactor > 0) || a.capacityFactor > 1e6:
		return nil, fmt.Errorf("--capacity-factor %v: want a factor above 0 (0 = off)", a.capacityFactor)
	case a.dropDevices < 1 || a.dropDevices > 1024:
		return nil, fmt.Errorf("--drop-devices %d: want 1 to 1024", a.dropDevices)
	}
	return &engine.DropOptions{Gamma: a.capacityFactor, Metric: m, Seed: 1, Expand: a.expandedDrop, DeviceLevel: a.deviceCapacity, Devices: a.dropDevices}, nil
}

// commitOptions are the Commit Router options of the global flags.
func (a *app) commitOptions() *engine.CommitOptions {
	return &engine.CommitOptions{Predictor: a.predictorFile, OWASpec: a.owaSpec, CrossToken: a.crossToken}
}

// hostRates reads --host, then --host-bw and --host-flops over it (0 when unset), and says
// where the rates come from.
func (a *app) hostRates() (engine.HostRates, string, error) {
	r, label, err := a.hostProfile()
	if err != nil {
		return r, "", err
	}
	if a.hostBW != "" || a.hostFLOPS != "" {
		label = strings.TrimPrefix(label+" with --host-bw/--host-flops", " with ")
	}
	if a.hostBW != "" {
		v, err := parseBytes(a.hostBW)
		if err != nil {
			return r, "", fmt.Errorf("--host-bw: %w", err)
		}
		r.Bandwidth = v
	}
	if a.hostFLOPS != "" {
		v, err := parseFLOPS(a.hostFLOPS)
		if err != nil {
			return r, "", fmt.Errorf("--host-flops: %w", err)
		}
		r.FLOPS = v
	}
	return r, label, nil
}

// hostProfile reads the rates of --host's profile (none: zero rates).
func (a *app) hostProfile() (engine.HostRates, string, error) {
	if a.host == "" {
		return engine.HostRates{}, "", nil
	}
	h, err := engine.LoadHost(a.host)
	if err != nil {
		return engine.HostRates{}, "", fmt.Errorf("--host: %w", err)
	}
	return h.Rates(), "host profile " + h.Name, nil
}

// session opens the model and one session on it; closing the returned func frees both.
func (a *app) session() (*engine.Model, *engine.Session, func(), error) {
	m, err := a.openModel()
	if err != nil {
		return nil, nil, nil, err
	}
	s, err := m.NewSession()
	if err != nil {
		m.Close()
		return nil, nil, nil, err
	}
	return m, s, func() { s.Close(); m.Close() }, nil
}
