package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/server"
)

// shutdownGrace is how long serve lets the requests in flight finish after SIGINT or SIGTERM
// before it cancels them.
const shutdownGrace = 3 * time.Second

func (a *app) serveCmd() *cobra.Command {
	var (
		host, keyFile, name, cors string
		port, queue, parallel     int
		key                       string
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve the model over HTTP: OpenAI-compatible /v1/chat/completions, /v1/completions, /v1/models",
		Long: "serve listens on --host:--port (loopback by default) and answers OpenAI's chat and completions routes,\n" +
			"streamed (server-sent events) or not, with the -m model on --device and every engine flag applied. It\n" +
			"answers GET /health with 503 while the model loads, then 200. Up to --parallel requests generate at once,\n" +
			"each on its own session, their next tokens computed in one forward pass (continuous batching: a layer's\n" +
			"experts are read, or copied to the GPU, once for all of them); an offload budget keeps room for their KV\n" +
			"caches before it sizes the expert slots. A request takes the session whose KV cache shares the most with\n" +
			"its prompt, so the next turn of a chat skips what it shares; up to --queue more wait, and beyond that a\n" +
			"request gets 503 with Retry-After. It speaks ollama's /api routes too. On loopback, requests whose Host\n" +
			"header is not local are refused; with --api-key or --api-key-file every route but /health needs\n" +
			"Authorization: Bearer KEY. SIGINT or SIGTERM stops accepting, gives the requests in flight a few seconds\n" +
			"and exits. Here --host is the address to listen on, as llama-server's; the host CPU's profile is\n" +
			"--host-profile.",
		Example: "  commit-run serve -m model.gguf --parallel 4\n" +
			"  commit-run serve -m model.gguf --device cuda:0 --port 8081 --api-key-file ~/.commit-run-key\n" +
			"  curl localhost:8080/v1/chat/completions -d '{\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}]}'",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if port < 0 || port > 65535 {
				return fmt.Errorf("--port %d: want 0 to 65535", port)
			}
			if queue < 0 || queue > 1<<20 {
				return fmt.Errorf("--queue %d: want 0 to %d", queue, 1<<20)
			}
			if parallel < 1 || parallel > engine.MaxParallel {
				return fmt.Errorf("--parallel %d: want 1 to %d", parallel, engine.MaxParallel)
			}
			opts, err := a.engineOptions(a.device, a.policy)
			if err != nil {
				return err
			}
			opts.Parallel = parallel
			if key != "" && keyFile != "" {
				return errors.New("--api-key and --api-key-file: give one")
			}
			if keyFile != "" {
				b, err := os.ReadFile(keyFile)
				if err != nil {
					return fmt.Errorf("--api-key-file: %w", err)
				}
				if key = strings.TrimSpace(string(b)); key == "" {
					return fmt.Errorf("--api-key-file %s: empty", keyFile)
				}
			}
			if err := a.checkModelPath(a.modelPath); err != nil {
				return err
			}
			addr := net.JoinHostPort(host, strconv.Itoa(port))
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				return fmt.Errorf("listen on %s: %w", addr, err)
			}
			ip := net.ParseIP(strings.Trim(host, "[]"))
			local := host == "localhost" || ip != nil && ip.IsLoopback()
			q := queue
			if q == 0 {
				q = -1 // the server's 0 is its default
			}
			var origins []string
			for _, o := range strings.Split(cors, ",") {
				if o = strings.TrimSpace(o); o != "" {
					origins = append(origins, o)
				}
			}
			srv := server.New(server.Options{ModelName: name, APIKey: key, Parallel: parallel, Queue: q, LocalOnly: local, CORSOrigins: origins})
			// Requests derive from reqCtx, which is canceled once the grace period after a
			// signal has passed.
			reqCtx, cancelReqs := context.WithCancel(context.Background())
			defer cancelReqs()
			hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second,
				BaseContext: func(net.Listener) context.Context { return reqCtx }}
			served := make(chan error, 1)
			go func() { served <- hs.Serve(ln) }()
			fmt.Fprintf(a.stderr, "commit-run: listening on http://%s (loading the model)\n", ln.Addr())

			m, err := a.openModelWith(opts)
			if err != nil {
				hs.Close()
				return err
			}
			defer m.Close()
			if parallel > 1 && !m.Batches() {
				fmt.Fprintf(a.stderr, "commit-run: --parallel %d with the Commit Router, which predicts one token's experts: each sequence decodes in passes of its own\n", parallel)
			}
			if parallel > 1 {
				kv := fmt.Sprintf("%d KV caches of %.1f MiB", parallel, float64(m.KVCacheBytes())/(1<<20))
				if st, ok := m.Offload(); ok {
					fmt.Fprintf(a.stderr, "commit-run: %d parallel sequences; the device budget holds their %s beside %d expert slots\n", parallel, kv, st.Slots)
				} else {
					fmt.Fprintf(a.stderr, "commit-run: %d parallel sequences, with %s\n", parallel, kv)
				}
			}
			if err := srv.SetModel(m); err != nil {
				hs.Close()
				return err
			}
			defer srv.Close()
			fmt.Fprintf(a.stderr, "commit-run: serving %s on http://%s\n", a.modelPath, ln.Addr())

			select {
			case err := <-served:
				return fmt.Errorf("serve: %w", err)
			case <-cmd.Context().Done():
			}
			fmt.Fprintln(a.stderr, "commit-run: stopping")
			time.AfterFunc(shutdownGrace, cancelReqs)
			ctx, cancel := context.WithTimeout(context.Background(), 2*shutdownGrace)
			defer cancel()
			if err := hs.Shutdown(ctx); err != nil {
				hs.Close()
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&host, "host", "127.0.0.1", "address to listen on (0.0.0.0: every interface)")
	f.IntVar(&port, "port", 8080, "TCP port to listen on (0: any free one)")
	f.StringVar(&key, "api-key", "", "require Authorization: Bearer `KEY` on every route but /health")
	f.StringVar(&keyFile, "api-key-file", "", "read the API key from `FILE`")
	f.IntVar(&parallel, "parallel", 1, "requests that generate at once, their decode steps batched into one pass")
	f.IntVar(&queue, "queue", server.DefaultQueue, "requests that may wait beyond those running (0: none)")
	f.StringVar(&name, "model-name", "", "the model id /v1/models lists (default: the file's name without .gguf)")
	f.StringVar(&cors, "cors", "", "comma-separated web `ORIGINS` (or *) whose pages may call the API from a browser (default: none)")
	return cmd
}
