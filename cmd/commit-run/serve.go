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

// serveFlags are serve's own flags.
type serveFlags struct {
	host, keyFile, name, cors  string
	port, queue, parallel      int
	key                        string
	strictName, refuseOverflow bool
	// readTimeout bounds a request's header, and then its body; idleTimeout a keep-alive
	// connection with no request.
	readTimeout, idleTimeout time.Duration
}

func (a *app) serveCmd() *cobra.Command {
	var sf serveFlags
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
			"request gets 503 with Retry-After. It speaks ollama's /api routes too. Any model name a request gives is\n" +
			"answered by the served model (--strict-model-name: 404). A chat that outgrows the context drops its\n" +
			"oldest turns after the system prompt, as ollama does (--refuse-overflow: 400). On loopback, requests\n" +
			"whose Host header is not local are refused; with --api-key or --api-key-file every route but /health and\n" +
			"the chat page at / needs Authorization: Bearer KEY. A request body slower than --read-timeout gets 408 (a\n" +
			"header, a closed connection). SIGINT or SIGTERM stops accepting, gives the requests in flight a few\n" +
			"seconds and exits. Here --host is the address to listen on, as llama-server's; the host CPU's profile is\n" +
			"--host-profile.",
		Example: "  commit-run serve -m model.gguf --parallel 4\n" +
			"  commit-run serve -m model.gguf --device cuda:0 --port 8081 --api-key-file ~/.commit-run-key\n" +
			"  curl localhost:8080/v1/chat/completions -d '{\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}]}'",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return a.serve(cmd.Context(), &sf) },
	}
	f := cmd.Flags()
	f.StringVar(&sf.host, "host", "127.0.0.1", "address to listen on (0.0.0.0: every interface)")
	f.IntVar(&sf.port, "port", 8080, "TCP port to listen on (0: any free one)")
	f.StringVar(&sf.key, "api-key", "", "require Authorization: Bearer `KEY` on every route but /health and the chat page")
	f.StringVar(&sf.keyFile, "api-key-file", "", "read the API key from `FILE`")
	f.IntVar(&sf.parallel, "parallel", 1, "requests that generate at once, their decode steps batched into one pass")
	f.IntVar(&sf.queue, "queue", server.DefaultQueue, "requests that may wait beyond those running (0: none)")
	f.StringVar(&sf.name, "model-name", "", "the model id /v1/models lists (default: the file's name without .gguf)")
	f.StringVar(&sf.cors, "cors", "", "comma-separated web `ORIGINS` (or *) whose pages may call the API from a browser (default: none)")
	f.BoolVar(&sf.strictName, "strict-model-name", false, "refuse requests that name another model (404) instead of answering them with this one")
	f.BoolVar(&sf.refuseOverflow, "refuse-overflow", false, "refuse a chat that has outgrown the context (400) instead of dropping its oldest turns after the system prompt")
	f.DurationVar(&sf.readTimeout, "read-timeout", server.DefaultBodyTimeout, "the longest a request's header, then its body, may take to arrive (408 after the header)")
	f.DurationVar(&sf.idleTimeout, "idle-timeout", 2*time.Minute, "close a keep-alive connection after this long without a request")
	return cmd
}

// check checks the flags and reads the API key from its file.
func (sf *serveFlags) check() error {
	if sf.port < 0 || sf.port > 65535 {
		return fmt.Errorf("--port %d: want 0 to 65535", sf.port)
	}
	if sf.queue < 0 || sf.queue > 1<<20 {
		return fmt.Errorf("--queue %d: want 0 to %d", sf.queue, 1<<20)
	}
	if sf.parallel < 1 || sf.parallel > engine.MaxParallel {
		return fmt.Errorf("--parallel %d: want 1 to %d", sf.parallel, engine.MaxParallel)
	}
	if sf.key != "" && sf.keyFile != "" {
		return errors.New("--api-key and --api-key-file: give one")
	}
	if sf.readTimeout < 100*time.Millisecond || sf.readTimeout > time.Hour {
		return fmt.Errorf("--read-timeout %v: want 100ms to 1h", sf.readTimeout)
	}
	if sf.idleTimeout < time.Second || sf.idleTimeout > 24*time.Hour {
		return fmt.Errorf("--idle-timeout %v: want 1s to 24h", sf.idleTimeout)
	}
	if sf.keyFile != "" {
		b, err := os.ReadFile(sf.keyFile)
		if err != nil {
			return fmt.Errorf("--api-key-file: %w", err)
		}
		if sf.key = strings.TrimSpace(string(b)); sf.key == "" {
			return fmt.Errorf("--api-key-file %s: empty", sf.keyFile)
		}
	}
	return nil
}

// serverOptions are the server's options the flags give.
func (sf *serveFlags) serverOptions() server.Options {
	ip := net.ParseIP(strings.Trim(sf.host, "[]"))
	local := sf.host == "localhost" || ip != nil && ip.IsLoopback()
	q := sf.queue
	if q == 0 {
		q = -1 // the server's 0 is its default
	}
	var origins []string
	for _, o := range strings.Split(sf.cors, ",") {
		if o = strings.TrimSpace(o); o != "" {
			origins = append(origins, o)
		}
	}
	return server.Options{ModelName: sf.name, StrictModelName: sf.strictName, APIKey: sf.key, Parallel: sf.parallel, Queue: q,
		LocalOnly: local, CORSOrigins: origins, BodyTimeout: sf.readTimeout, RefuseOverflow: sf.refuseOverflow}
}

// serve listens at once, answering /health with 503 while the model loads, serves until ctx
// ends, then shuts down gracefully.
func (a *app) serve(ctx context.Context, sf *serveFlags) error {
	if err := sf.check(); err != nil {
		return err
	}
	opts, err := a.engineOptions(a.device, a.runPolicy())
	if err != nil {
		return err
	}
	opts.Parallel = sf.parallel
	if err := a.checkModelPath(a.modelPath); err != nil {
		return err
	}
	addr := net.JoinHostPort(sf.host, strconv.Itoa(sf.port))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", addr, err)
	}
	srv := server.New(sf.serverOptions())
	// Requests derive from reqCtx, which is canceled once the grace period after a signal
	// has passed.
	reqCtx, cancelReqs := context.WithCancelCause(context.Background())
	defer cancelReqs(server.ErrShutdown)
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: sf.readTimeout, IdleTimeout: sf.idleTimeout,
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
	a.noteParallel(m, sf.parallel)
	if err := srv.SetModel(m); err != nil {
		hs.Close()
		return err
	}
	defer srv.Close()
	fmt.Fprintf(a.stderr, "commit-run: serving %s on http://%s\n", a.modelPath, ln.Addr())

	select {
	case err := <-served:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	fmt.Fprintln(a.stderr, "commit-run: stopping")
	// The answers the grace period cuts end with an error event (streams) or 503, never as if
	// they were whole.
	time.AfterFunc(shutdownGrace, func() { cancelReqs(server.ErrShutdown) })
	sctx, cancel := context.WithTimeout(context.Background(), 2*shutdownGrace)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		hs.Close()
	}
	return nil
}

// noteParallel says what parallel sequences cost and how they decode.
func (a *app) noteParallel(m *engine.Model, parallel int) {
	if parallel <= 1 {
		return
	}
	if !m.Batches() {
		fmt.Fprintf(a.stderr, "commit-run: --parallel %d with the Commit Router, which predicts one token's experts: each sequence decodes in passes of its own\n", parallel)
	}
	kv := fmt.Sprintf("%d KV caches of %.1f MiB", parallel, float64(m.KVCacheBytes())/(1<<20))
	if st, ok := m.Offload(); ok {
		fmt.Fprintf(a.stderr, "commit-run: %d parallel sequences; the device budget holds their %s beside %d expert slots\n", parallel, kv, st.Slots)
	} else {
		fmt.Fprintf(a.stderr, "commit-run: %d parallel sequences, with %s\n", parallel, kv)
	}
}
