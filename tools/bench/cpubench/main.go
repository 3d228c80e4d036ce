// Command cpubench is `make bench-cpu`: commit-run's CPU prompt and decode speed beside
// llama.cpp's (its prebuilt CPU backend through node-llama-cpp, tools/golden/ref/bench.mjs),
// in the manner of llama-bench, on synthetic GGUF files of real MoE shapes (OLMoE-1B-7B,
// Qwen3-30B-A3B) with fewer layers, in Q4_K_M, Q8_0 and Q4_0.
//
// Tests are ppN (a prompt of N tokens, tokens/s of the prompt pass), tgN (N tokens decoded one
// at a time after a 1-token prompt) and tgN@dD (after a D-token prompt). Both engines run on
// the same file, threads and prompt token ids, alternating, and the table shows each one's
// median tokens/s, their ratio and each one's peak resident memory. Decode is also set against
// its physical limit: the bytes a token reads (from the file's tensors) over the host's memory
// read bandwidth, measured here at each thread count.
//
//	go run ./tools/bench/cpubench                    # the full benchmark: long (see -plan)
//	go run ./tools/bench/cpubench -shapes olmoe -types q4_0 -layers 1 -tests pp16,tg8 -reps 1
//	go run ./tools/bench/cpubench -plan              # the files, layers and runs, nothing run
//
// Model files are generated once into -work and reused. Progress goes to stderr, the table
// (or -json) to stdout; a failing engine run is reported and the benchmark goes on.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/commit-run/commit-run/cpu"
)

func main() {
	// Cancelling kills the engine run in progress (exec.CommandContext), then the table of
	// what was measured is printed.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "cpubench:", err)
		os.Exit(1)
	}
}

// options are the parsed flags.
type options struct {
	shapes   []shape
	types    []wtype
	tests    []test
	threads  []int
	reps     int
	layers   int
	maxFile  int64
	work     string
	regen    bool
	seed     uint64
	batch    int
	mmap     bool
	timeout  time.Duration
	bwSize   int64
	bwReps   int
	bin      string
	node     string
	script   string
	asJSON   bool
	planOnly bool
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("cpubench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		o                                     options
		shapeList, typeList, testList, thList string
		maxGB, bwMiB                          float64
	)
	fs.StringVar(&shapeList, "shapes", "all", "shapes, comma-separated: olmoe, qwen3moe, qwen36, gptoss (or all)")
	fs.StringVar(&typeList, "types", "all", "weight types, comma-separated: q4km (Q4_K_M), q8_0, q4_0-preset (Q4_0), or all")
	fs.StringVar(&testList, "tests", defaultTests, "tests, comma-separated: ppN, tgN, tgN@dD")
	fs.StringVar(&thList, "threads", "0", "thread counts, comma-separated (0 = every core)")
	fs.IntVar(&o.reps, "reps", 3, "runs of each engine per test; the table shows the median")
	fs.IntVar(&o.layers, "layers", 0, "layers of every file (0 = the most that keep each file under -max-file-gb)")
	fs.Float64Var(&maxGB, "max-file-gb", 2, "largest model file in GB (1e9 bytes), for the automatic layer count")
	fs.StringVar(&o.work, "work", filepath.Join(os.TempDir(), "commit-run-bench"), "folder of the generated model files, reused between runs")
	fs.BoolVar(&o.regen, "regen", false, "generate the model files again even if they exist")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of the model weights and of the prompt token ids")
	fs.IntVar(&o.batch, "batch", 256, "llama.cpp's n_batch = n_ubatch: keep it at commit-run's prefill pass (engine/session.go prefillBatch)")
	fs.BoolVar(&o.mmap, "llama-mmap", false, "let llama.cpp memory-map the weights (first touches then land in its timing; default: --no-mmap)")
	fs.DurationVar(&o.timeout, "run-timeout", 30*time.Minute, "longest one engine run may take")
	fs.Float64Var(&bwMiB, "bw-mib", 1024, "buffer streamed to measure the memory read bandwidth, MiB (well above the last-level cache)")
	fs.IntVar(&o.bwReps, "bw-reps", 5, "passes per reader over the bandwidth buffer (the best counts)")
	fs.StringVar(&o.bin, "commit-run", "bin/commit-run", "commit-run binary (make bench-cpu builds it)")
	fs.StringVar(&o.node, "node", "node", "Node.js binary")
	fs.StringVar(&o.script, "bench-mjs", "tools/golden/ref/bench.mjs", "llama.cpp driver script")
	fs.BoolVar(&o.asJSON, "json", false, "print the report as JSON instead of the table")
	fs.BoolVar(&o.planOnly, "plan", false, "print the files, layer counts and runs, and stop")
	if err := fs.Parse(args); err != nil {
		return options{}, err
	}
	if fs.NArg() > 0 {
		return options{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var err error
	if o.shapes, err = parseShapes(shapeList); err != nil {
		return options{}, err
	}
	if o.types, err = parseTypes(typeList); err != nil {
		return options{}, err
	}
	if o.tests, err = parseTests(testList); err != nil {
		return options{}, err
	}
	if o.threads, err = parseThreads(thList, runtime.NumCPU()); err != nil {
		return options{}, err
	}
	switch {
	case o.reps < 1:
		return options{}, fmt.Errorf("-reps %d: want at least 1", o.reps)
	case o.layers < 0 || o.layers > maxLayers:
		return options{}, fmt.Errorf("-layers %d: want 0 (automatic) to %d", o.layers, maxLayers)
	case maxGB <= 0:
		return options{}, fmt.Errorf("-max-file-gb %g: want a positive size", maxGB)
	case o.batch < 1:
		return options{}, fmt.Errorf("-batch %d: want at least 1", o.batch)
	case bwMiB < 1 || o.bwReps < 1:
		return options{}, fmt.Errorf("-bw-mib %g, -bw-reps %d: want at least 1 of each", bwMiB, o.bwReps)
	}
	o.maxFile, o.bwSize = int64(maxGB*1e9), int64(bwMiB*(1<<20))
	return o, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	start := time.Now()
	logf := func(format string, a ...any) {
		fmt.Fprintf(stderr, "[%6.0fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, a...))
	}
	files, err := layout(o)
	if err != nil {
		return err
	}
	if o.planOnly {
		return printPlan(stdout, o, files)
	}
	for _, p := range []string{o.bin, o.script} {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("%w (run from the repository root; make bench-cpu builds bin/commit-run)", err)
		}
	}
	if _, err := exec.LookPath(o.node); err != nil {
		return fmt.Errorf("node: %w", err)
	}
	rep := &report{Host: hostInfo(), Settings: settings{Reps: o.reps, Seed: o.seed, Batch: o.batch,
		LlamaMmap: o.mmap, CommitRun: commitRunVersion(o.bin), LlamaCpp: "not run"}}
	for _, th := range o.threads {
		logf("measuring the memory read bandwidth with %d threads over %d MiB", th, o.bwSize>>20)
		bw, err := measureBandwidth(th, o.bwSize, o.bwReps)
		if err != nil {
			return err
		}
		logf("  %.1f GB/s (%s)", bw.GBps, bw.Reader)
		rep.Bandwidth = append(rep.Bandwidth, bw)
	}
	b := &bench{o: o, rep: rep, logf: logf,
		ours:   commitRun(o.bin, o.timeout),
		theirs: llamaCpp(o.node, o.script, o.timeout)}
	for _, f := range files {
		if ctx.Err() != nil {
			break
		}
		b.file(ctx, f)
	}
	if ctx.Err() != nil {
		logf("interrupted: reporting what was measured")
	}
	if o.asJSON {
		return writeJSON(stdout, rep)
	}
	return writeTable(stdout, rep)
}

// hostInfo names the CPU (from /proc/cpuinfo where there is one).
func hostInfo() host {
	h := host{CPU: runtime.GOARCH, Cores: runtime.NumCPU(), L3Bytes: cpu.LargestCache()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				h.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	return h
}

// commitRunVersion is the binary and the source revision it was most likely built from (make
// bench-cpu builds it just before).
func commitRunVersion(bin string) string {
	out, err := exec.Command("git", "describe", "--always", "--dirty").Output()
	if err != nil {
		return bin
	}
	return fmt.Sprintf("%s (source %s)", bin, strings.TrimSpace(string(out)))
}
