package main

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/commit-run/commit-run/offload"
	"github.com/spf13/pflag"
)

func TestParseFLOPS(t *testing.T) {
	tests := []struct {
		in   string
		want float64 // 0: an error
	}{
		{"150G", 150e9}, {"1.5T", 1.5e12}, {"150GFLOPS", 150e9}, {" 2.5 tflop/s ", 2.5e12}, {"800m", 800e6}, {"4e10", 4e10},
		{"", 0}, {"G", 0}, {"fast", 0}, {"-3G", 0}, {"0", 0}, {"NaN", 0}, {"1e308T", 0}, {"150GB", 0},
	}
	for _, tt := range tests {
		got, err := parseFLOPS(tt.in)
		if tt.want == 0 {
			if err == nil || !strings.Contains(err.Error(), "positive rate") {
				t.Errorf("parseFLOPS(%q) = %v, %v; want an error", tt.in, got, err)
			}
		} else if err != nil || got != tt.want {
			t.Errorf("parseFLOPS(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
}

func TestParseTokens(t *testing.T) {
	tests := []struct {
		in      string
		want    []int32
		wantErr string
	}{
		{in: "1,2,3", want: []int32{1, 2, 3}},
		{in: " 1 , 2,3 ", want: []int32{1, 2, 3}},
		{in: "[5, 0, 7]", want: []int32{5, 0, 7}}, // pasted from generate --json
		{in: "42", want: []int32{42}},
		{in: "2147483647", want: []int32{math.MaxInt32}},
		{in: "", wantErr: "no token ids"},
		{in: "[]", wantErr: "no token ids"},
		{in: "1,,2", wantErr: "empty id at position 1"},
		{in: "1,2,", wantErr: "empty id at position 2"},
		{in: "1,x", wantErr: `"x" at position 1 is not a token id`},
		{in: "1.5", wantErr: "not a token id"},
		{in: "-1", wantErr: "negative id -1"},
		{in: "2147483648", wantErr: "not a token id"}, // overflows int32
		{in: "1 2 3", wantErr: "not a token id"},
	}
	for _, tt := range tests {
		got, err := parseTokens(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("parseTokens(%q) error = %v, want containing %q", tt.in, err, tt.wantErr)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("parseTokens(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
}

func TestCheckVocab(t *testing.T) {
	tests := []struct {
		ids     []int32
		vocab   int
		wantErr string
	}{
		{ids: []int32{0, 9}, vocab: 10},
		{ids: []int32{0, 10}, vocab: 10, wantErr: "id 10 at position 1 is out of range: the vocabulary has 10 tokens (0..9)"},
		{ids: []int32{1 << 30}, vocab: 0}, // unknown vocabulary: the engine decides
	}
	for _, tt := range tests {
		err := checkVocab(tt.ids, tt.vocab)
		if (err == nil) != (tt.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("checkVocab(%v, %d) = %v, want %q", tt.ids, tt.vocab, err, tt.wantErr)
		}
	}
}

func TestGenFlags(t *testing.T) {
	tests := []struct {
		args    []string
		wantErr string
		check   func(t *testing.T, g *genFlags)
	}{
		{args: nil, check: func(t *testing.T, g *genFlags) {
			if g.temp != 0.8 || g.topK != 40 || g.topP != 0.95 || g.repeatLastN != 64 {
				t.Errorf("defaults = %+v, want llama.cpp's", g)
			}
		}},
		{args: []string{"-n", "7", "--greedy", "--seed", "9", "--stop", "a", "--stop", "b,c"}, check: func(t *testing.T, g *genFlags) {
			o, _ := g.options()
			if o.MaxTokens != 7 || !o.Sampler.Greedy || o.Sampler.Seed != 9 || !slices.Equal(o.Stop, []string{"a", "b,c"}) {
				t.Errorf("options = %+v", o)
			}
		}},
		{args: []string{"-n", "-1"}, wantErr: "-n -1"},
		{args: []string{"-n", "999999999"}, wantErr: "-n 999999999"},
		{args: []string{"--temp", "-0.5"}, wantErr: "--temp"},
		{args: []string{"--temp", "NaN"}, wantErr: "--temp"},
		{args: []string{"--top-k", "-2"}, wantErr: "--top-k"},
		{args: []string{"--top-p", "1.5"}, wantErr: "--top-p"},
		{args: []string{"--repeat-penalty", "+Inf"}, wantErr: "--repeat-penalty"},
		{args: []string{"--repeat-last-n", "-1"}, wantErr: "--repeat-last-n"},
		{args: []string{"--stop", ""}, wantErr: "--stop"},
	}
	for _, tt := range tests {
		var g genFlags
		fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
		g.register(fs, true)
		if err := fs.Parse(tt.args); err != nil {
			t.Fatalf("parse %v: %v", tt.args, err)
		}
		_, err := g.options()
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%v: error = %v, want containing %q", tt.args, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%v: %v", tt.args, err)
			continue
		}
		if tt.check != nil {
			tt.check(t, &g)
		}
	}
}

// Without --seed each run draws its own seed, and reports it, so runs differ but can be replayed.
func TestRandomSeed(t *testing.T) {
	seeds := map[uint64]bool{}
	for range 4 {
		var g genFlags
		fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
		g.register(fs, false)
		o, err := g.options()
		if err != nil || o.Sampler.Seed != g.seed {
			t.Fatalf("options = %+v, %v; g.seed = %d", o, err, g.seed)
		}
		seeds[g.seed] = true
	}
	if len(seeds) < 2 {
		t.Errorf("4 runs drew the seeds %v", seeds)
	}
}

func TestTopN(t *testing.T) {
	probs := []float32{0.1, 0.4, 0.1, 0.3, 0.1}
	tests := []struct {
		n    int
		want []int
	}{
		{1, []int{1}},
		{2, []int{1, 3}},
		{4, []int{1, 3, 0, 2}}, // ties keep the lower id first
		{9, []int{1, 3, 0, 2, 4}},
	}
	for _, tt := range tests {
		if got := topN(probs, tt.n); !slices.Equal(got, tt.want) {
			t.Errorf("topN(%d) = %v, want %v", tt.n, got, tt.want)
		}
	}
}

func TestAppendProbsLine(t *testing.T) {
	probs := []float32{0.25, 0.5, 1e-7, 0.2499999}
	line, err := appendProbsLine(nil, 3, 17, probs, 0)
	if err != nil {
		t.Fatal(err)
	}
	var full struct {
		Pos   int       `json:"pos"`
		Token int32     `json:"token"`
		Probs []float32 `json:"probs"`
	}
	if err := json.Unmarshal(line, &full); err != nil || line[len(line)-1] != '\n' {
		t.Fatalf("line %q: %v", line, err)
	}
	if full.Pos != 3 || full.Token != 17 || !slices.Equal(full.Probs, probs) {
		t.Errorf("decoded %+v, want pos 3 token 17 probs %v (exactly)", full, probs)
	}

	line, _ = appendProbsLine(nil, 0, 1, probs, 2)
	if want := `{"pos":0,"token":1,"top":[[1,0.5],[0,0.25]]}` + "\n"; string(line) != want {
		t.Errorf("top line = %q, want %q", line, want)
	}

	if _, err := appendProbsLine(nil, 0, 1, []float32{float32(math.NaN())}, 0); err == nil {
		t.Error("NaN probability gave no error")
	}
}

func TestHumanUnits(t *testing.T) {
	bytes := map[int64]string{0: "0 B", 1023: "1023 B", 1536: "1.50 KiB", 3 << 30: "3.00 GiB"}
	for n, want := range bytes {
		if got := humanBytes(n); got != want {
			t.Errorf("humanBytes(%d) = %q, want %q", n, got, want)
		}
	}
	counts := map[int64]string{999: "999", 2_700_000_000: "2.70B", 46_700_000_000: "46.70B", 1_500_000: "1.50M"}
	for n, want := range counts {
		if got := humanCount(n); got != want {
			t.Errorf("humanCount(%d) = %q, want %q", n, got, want)
		}
	}
}

// Bad flags must fail with one clear line and status 1, before any model is loaded (these run
// against a model path that does not exist).
func TestBadFlags(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "none.gguf")
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--threads", "-1", "inspect"}, "--threads -1"},
		{[]string{"--threads", "100000", "inspect"}, "--threads 100000"},
		{[]string{"--ctx", "-5", "inspect"}, "--ctx -5"},
		{[]string{"--kv-type", "q4", "inspect"}, `--kv-type "q4"`},
		{[]string{"--gpu-row-warps", "3", "inspect"}, "--gpu-row-warps 3: want one of [1 2 4 8]"},
		{[]string{"--gpu-row-warps", "0", "inspect"}, "--gpu-row-warps 0"},
		{[]string{"--profile", "heap", "inspect"}, `--profile "heap"`},
		{[]string{"--threads", "two", "inspect"}, `invalid argument "two"`},
		{[]string{"generate", "-m", missing}, "exactly one of --prompt"},
		{[]string{"generate", "-m", missing, "--prompt", "a", "--tokens", "1"}, "exactly one of --prompt"},
		{[]string{"generate", "-m", missing, "--tokens", "1,,2"}, "empty id"},
		{[]string{"generate", "-m", missing, "--tokens", "1", "-n", "-4"}, "-n -4"},
		{[]string{"generate", "-m", missing, "--tokens", "1", "-n", "99999999999999999999"}, "out of range"},
		{[]string{"generate", "-m", missing, "--tokens", "1", "--top-p", "2"}, "--top-p"},
		{[]string{"generate", "-m", missing, "--tokens", "1"}, "does not exist; pass a GGUF file with -m FILE"},
		{[]string{"generate", "extra", "--tokens", "1"}, `unknown command "extra"`},
		{[]string{"logits", "-m", missing}, "exactly one of --tokens"},
		{[]string{"logits", "-m", missing, "--tokens", "1", "--top", "-1"}, "--top -1"},
		{[]string{"eval", "ppl", "-m", missing}, "needs --text FILE"},
		{[]string{"eval", "ppl", "-m", missing, "--text", "x", "--window", "1"}, "--window 1"},
		{[]string{"eval", "ppl", "-m", missing, "--text", missing}, "--text"},
		{[]string{"chat", "-m", missing, "--temp", "-1"}, "--temp"},
		{[]string{"inspect", missing}, "does not exist"},
		{[]string{"inspect", "a", "b"}, "accepts at most 1 arg"},
		{[]string{"nosuch"}, `unknown command "nosuch"`},
	}
	for _, tt := range tests {
		out, errOut, code := runCLI(t, "", tt.args...)
		if code != 1 || !strings.Contains(errOut, tt.want) || strings.Count(errOut, "\n") != 1 || out != "" {
			t.Errorf("%v: code %d, stdout %q, stderr %q; want code 1 and one stderr line containing %q",
				tt.args, code, out, errOut, tt.want)
		}
	}
}

// The default model path is relative to the working directory; when it is missing the error
// must say how to choose another.
func TestDefaultModelMissing(t *testing.T) {
	t.Chdir(t.TempDir())
	_, errOut, code := runCLI(t, "", "generate", "--tokens", "1")
	if code != 1 || !strings.Contains(errOut, defaultModel) || !strings.Contains(errOut, "-m FILE") {
		t.Errorf("code %d, stderr %q", code, errOut)
	}
}

// The profile must be written even when the command fails.
func TestProfileWrittenOnError(t *testing.T) {
	dir := t.TempDir()
	_, errOut, code := runCLI(t, "", "--profile", "cpu", "--profile-dir", dir, "inspect", filepath.Join(dir, "none.gguf"))
	if code != 1 {
		t.Fatalf("code %d, stderr %q", code, errOut)
	}
	if st, err := os.Stat(filepath.Join(dir, "cpu.pprof")); err != nil || st.Size() == 0 {
		t.Errorf("cpu.pprof: %v (stderr %q)", err, errOut)
	}
}

func TestInterrupts(t *testing.T) {
	var canceled, forced, custom int
	in := newInterrupts(func() { canceled++ }, func() { forced++ })

	restore := in.set(func() { custom++ })
	in.deliver(os.Interrupt)
	in.deliver(os.Interrupt)
	in.deliver(syscall.SIGTERM) // always the default meaning
	restore()
	in.deliver(os.Interrupt) // repeated: force
	if custom != 2 || canceled != 1 || forced != 1 {
		t.Errorf("custom %d canceled %d forced %d, want 2 1 1", custom, canceled, forced)
	}
}

// TestSplitFlags: --cpu-moe-layers alone asks for llama.cpp's split, as its --n-cpu-moe
// does, in the card's whole memory (a budget of 0 to the engine); with --gpu-mem, in that
// budget; beside another policy it is refused.
func TestSplitFlags(t *testing.T) {
	for _, c := range []struct {
		args   []string
		policy offload.Policy
		layers int
		mem    int64
		err    string
	}{
		{args: []string{"--cpu-moe-layers", "3"}, policy: offload.Static, layers: 3},
		{args: []string{"--cpu-moe-layers", "3", "--gpu-mem", "1GiB"}, policy: offload.Static, layers: 3, mem: 1 << 30},
		{args: []string{"--cpu-moe-layers", "2", "--policy", "static-cache"}, policy: offload.StaticCache, layers: 2},
		{args: []string{"--policy", "static"}, policy: offload.Static},
		{args: []string{"--cpu-moe-layers", "2", "--policy", "hot"}, err: "pass a device memory budget with --gpu-mem"},
		{args: []string{"--cpu-moe-layers", "2", "--policy", "hot", "--gpu-mem", "1GiB"}, err: "pass --policy static or static-cache"},
	} {
		a := &app{stopProf: func() {}}
		root := a.rootCmd()
		if err := root.PersistentFlags().Parse(c.args); err != nil {
			t.Fatal(err)
		}
		opts, err := a.engineOptions("sim:rtx4090", a.runPolicy())
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%v: %v, want an error mentioning %q", c.args, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%v: %v", c.args, err)
			continue
		}
		if o := opts.Offload; o == nil || o.Policy != c.policy || o.HostLayers != c.layers || o.GPUMem != c.mem {
			t.Errorf("%v: offload %+v, want policy %v, %d host layers, a budget of %d bytes", c.args, o, c.policy, c.layers, c.mem)
		}
	}
}
