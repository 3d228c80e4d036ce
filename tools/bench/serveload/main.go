// Command serveload is the server's load benchmark: for each number of streams N it starts
// `commit-run serve --parallel P` (P the most streams, or -parallel; with the engine flags
// given after --), runs N clients that stream completions of a fixed length through OpenAI's
// Go SDK for a fixed time, one request after another, and stops the server. It prints, per
// N, the generated tokens/s of all the streams together and of one, the time to first token
// (p50, p90), the requests and errors, the mean batch of the decode steps and, when the model
// offloads, the expert bytes copied per generated token, from the server's /metrics. The
// stream counts are run in turn, -rounds times, and each figure is the median of its rounds.
// With -url it loads a server already running instead (llama-server, to set the two side by
// side).
//
//	go run ./tools/bench/serveload -commit-run bin/commit-run -m models/testdata/tinymoe-qwen2moe.gguf
//	go run ./tools/bench/serveload -m M -streams 1,2,4,8 -- --device sim:rtx2080ti --gpu-mem 12MiB
//	go run ./tools/bench/serveload -url http://127.0.0.1:8081   # llama-server -m M --parallel 4
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

func main() {
	bin := flag.String("commit-run", "bin/commit-run", "the commit-run binary")
	modelPath := flag.String("m", "models/testdata/tinymoe-qwen2moe.gguf", "the GGUF model to serve")
	streamList := flag.String("streams", "1,2,4", "comma-separated numbers of concurrent streams")
	duration := flag.Duration("duration", 10*time.Second, "how long the clients start requests")
	tokens := flag.Int("tokens", 64, "tokens per answer (max_tokens, with ignore_eos)")
	rounds := flag.Int("rounds", 3, "times each stream count runs, in turn with the others")
	url := flag.String("url", "", "load this running server instead of starting commit-run serve (llama-server, say; it must run the most streams at once)")
	parallel := flag.Int("parallel", 0, "serve --parallel for every run (0: the most streams), so that every run has the same KV caches and expert slots")
	flag.Parse()
	var streams []int
	for _, f := range strings.Split(*streamList, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			fail(fmt.Errorf("-streams %q: want positive numbers", *streamList))
		}
		streams = append(streams, n)
	}
	if *rounds < 1 || *tokens < 1 || *duration <= 0 {
		fail(errors.New("-rounds, -tokens and -duration must be positive"))
	}
	if *parallel == 0 {
		*parallel = slices.Max(streams)
	}
	if *parallel < slices.Max(streams) {
		fail(fmt.Errorf("-parallel %d: fewer than the %d streams", *parallel, slices.Max(streams)))
	}
	results := map[int][]result{}
	for r := range *rounds {
		for _, n := range streams {
			var res result
			var err error
			if *url != "" {
				res, err = load(*url, n, *duration, *tokens)
			} else {
				res, err = run(*bin, *modelPath, flag.Args(), *parallel, n, *duration, *tokens)
			}
			if err != nil {
				fail(fmt.Errorf("%d streams, round %d: %w", n, r+1, err))
			}
			fmt.Fprintf(os.Stderr, "serveload: round %d, %d streams: %.1f tokens/s\n", r+1, n, res.tokensPerSec)
			results[n] = append(results[n], res)
		}
	}
	if *url != "" {
		fmt.Printf("%s, %d-token answers for %s, median of %d rounds\n\n", *url, *tokens, *duration, *rounds)
	} else {
		fmt.Printf("commit-run serve --parallel %d, %s %s, %d-token answers for %s, median of %d rounds\n\n", *parallel, *modelPath, strings.Join(flag.Args(), " "), *tokens, *duration, *rounds)
	}
	fmt.Println("| streams | tokens/s | per stream | x 1 stream | TTFT p50 ms | TTFT p90 ms | requests | errors | mean batch | expert MB copied / token |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|")
	base := 0.0
	for _, n := range streams {
		rs := results[n]
		tps := median(rs, func(r result) float64 { return r.tokensPerSec })
		if n == streams[0] {
			base = tps / float64(n)
		}
		copied, batch := "-", "-"
		if mb := median(rs, func(r result) float64 { return r.meanBatch }); mb > 0 {
			batch = fmt.Sprintf("%.2f", mb)
		}
		if rs[0].offloads {
			copied = fmt.Sprintf("%.3f", median(rs, func(r result) float64 { return r.copiedPerToken })/1e6)
		}
		fmt.Printf("| %d | %.1f | %.1f | %.2f | %.1f | %.1f | %.0f | %.0f | %s | %s |\n", n, tps, tps/float64(n), tps/base,
			median(rs, func(r result) float64 { return r.ttft50 * 1e3 }), median(rs, func(r result) float64 { return r.ttft90 * 1e3 }),
			median(rs, func(r result) float64 { return float64(r.requests) }), median(rs, func(r result) float64 { return float64(r.errors) }),
			batch, copied)
	}
	if streams[0] != 1 {
		fmt.Println("\n(x 1 stream: against the first stream count's rate per stream)")
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "serveload:", err)
	os.Exit(1)
}

// result is one run of n streams.
type result struct {
	tokensPerSec     float64
	ttft50, ttft90   float64
	requests, errors int
	meanBatch        float64
	offloads         bool
	copiedPerToken   float64
}

func median(rs []result, f func(result) float64) float64 {
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = f(r)
	}
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

var listening = regexp.MustCompile(`listening on (http://\S+)`)

// run serves the model with --parallel p, loads it with n streams and stops it.
func run(bin, modelPath string, engineFlags []string, p, n int, d time.Duration, tokens int) (result, error) {
	args := append([]string{"-m", modelPath}, engineFlags...)
	args = append(args, "serve", "--port", "0", "--parallel", strconv.Itoa(p), "--queue", "0")
	cmd := exec.Command(bin, args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return result{}, err
	}
	if err := cmd.Start(); err != nil {
		return result{}, err
	}
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	}()
	url, log := "", &strings.Builder{}
	sc := bufio.NewScanner(stderr)
	for url == "" && sc.Scan() {
		fmt.Fprintln(log, sc.Text())
		if m := listening.FindStringSubmatch(sc.Text()); m != nil {
			url = m[1]
		}
	}
	if url == "" {
		return result{}, fmt.Errorf("the server did not start: %s", log)
	}
	go io.Copy(io.Discard, stderr)
	if err := waitHealthy(url, cmd); err != nil {
		return result{}, err
	}
	return load(url, n, d, tokens)
}

// load runs n streaming clients against the server at url for d and measures them; the
// server's own figures come from its /metrics where it has commit-run's.
func load(url string, n int, d time.Duration, tokens int) (result, error) {
	before, _ := scrape(url)
	c := openai.NewClient(option.WithBaseURL(url+"/v1/"), option.WithMaxRetries(0))
	var (
		mu     sync.Mutex
		ttfts  []float64
		total  int
		errs   int
		reqs   int
		wg     sync.WaitGroup
		start  = time.Now()
		finish = start.Add(d)
	)
	for i := range n {
		wg.Go(func() {
			for k := 0; time.Now().Before(finish); k++ {
				prompt := fmt.Sprintf("Stream %d, request %d. Once upon a time, in a land far away, there lived", i, k)
				t0 := time.Now()
				s := c.Completions.NewStreaming(context.Background(), openai.CompletionNewParams{
					Prompt:        openai.CompletionNewParamsPromptUnion{OfString: openai.String(prompt)},
					MaxTokens:     openai.Int(int64(tokens)),
					Temperature:   openai.Float(0.8),
					StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
				}, option.WithJSONSet("ignore_eos", true))
				first, got, chunks := 0.0, 0, 0
				for s.Next() {
					ch := s.Current()
					if first == 0 && len(ch.Choices) > 0 {
						first = time.Since(t0).Seconds()
					}
					if len(ch.Choices) > 0 && ch.Choices[0].Text != "" {
						chunks++
					}
					if ch.Usage.CompletionTokens > 0 {
						got = int(ch.Usage.CompletionTokens)
					}
				}
				if got == 0 {
					got = chunks // a server that sends no usage: a token a chunk
				}
				mu.Lock()
				reqs++
				if err := s.Err(); err != nil || got == 0 {
					errs++
					if errs == 1 {
						fmt.Fprintf(os.Stderr, "serveload: request failed (%d tokens): %v\n", got, err)
					}
				} else {
					total += got
					ttfts = append(ttfts, first)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	wall := time.Since(start).Seconds()
	after, _ := scrape(url)
	slices.Sort(ttfts)
	res := result{tokensPerSec: float64(total) / wall, requests: reqs, errors: errs}
	if len(ttfts) > 0 {
		res.ttft50, res.ttft90 = ttfts[len(ttfts)/2], ttfts[min(len(ttfts)-1, len(ttfts)*9/10)]
	}
	delta := func(name string) float64 { return after[name] - before[name] }
	if _, ok := after["commit_run_generated_tokens_total"]; ok {
		res.meanBatch = 1 // commit-run's, without batching
	}
	if steps := delta("commit_run_decode_steps_total"); steps > 0 {
		res.meanBatch = delta("commit_run_decode_step_rows_total") / steps
	}
	if _, ok := after["commit_run_expert_bytes_copied_total"]; ok {
		res.offloads = true
		res.copiedPerToken = delta("commit_run_expert_bytes_copied_total") / max(delta("commit_run_generated_tokens_total"), 1)
	}
	return res, nil
}

func waitHealthy(url string, cmd *exec.Cmd) error {
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		if r, err := http.Get(url + "/health"); err == nil {
			r.Body.Close()
			if r.StatusCode == http.StatusOK {
				return nil
			}
		}
		if cmd.ProcessState != nil {
			return errors.New("the server exited while loading")
		}
		time.Sleep(50 * time.Millisecond)
	}
	return errors.New("the model did not load in 5 minutes")
}

// scrape reads the server's unlabelled counters and gauges from /metrics (none where it has no
// /metrics).
func scrape(url string) (map[string]float64, error) {
	r, err := http.Get(url + "/metrics")
	if err != nil {
		return nil, err
	}
	defer r.Body.Close()
	if r.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/metrics: %s", r.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r.Body)
	if err != nil {
		return nil, fmt.Errorf("/metrics: %w", err)
	}
	out := map[string]float64{}
	for name, f := range fams {
		for _, m := range f.Metric {
			if len(m.Label) > 0 {
				continue
			}
			switch {
			case m.Counter != nil:
				out[name] = m.Counter.GetValue()
			case m.Gauge != nil:
				out[name] = m.Gauge.GetValue()
			}
		}
	}
	return out, nil
}
