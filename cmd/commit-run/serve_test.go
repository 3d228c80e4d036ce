package main

import (
	"bytes"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// lockedBuffer is a bytes.Buffer that the command and the test may use at once.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestServe runs serve: /health turns 200 once the model has loaded, a chat request is
// answered, and SIGTERM stops it with exit status 0 while a long request is in flight.
func TestServe(t *testing.T) {
	model := needModel(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	url := "http://127.0.0.1:" + port
	sig := make(chan os.Signal, 1)
	var out, errOut lockedBuffer
	done := make(chan int, 1)
	go func() {
		done <- run([]string{"serve", "-m", model, "--port", port, "--ctx", "256", "--parallel", "2"}, strings.NewReader(""), &out, &errOut, sig)
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		r, err := http.Get(url + "/health")
		if err == nil {
			r.Body.Close()
			if r.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no healthy server after 30 s: %v; stderr %q", err, errOut.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	r, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(`{"messages":[{"role":"user","content":"Hello"}],"max_tokens":4}`))
	if err != nil || r.StatusCode != 200 {
		t.Fatalf("chat: %v %v", r, err)
	}
	r.Body.Close()

	inFlight := make(chan error, 1)
	go func() {
		r, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"Once","max_tokens":200,"stream":true}`))
		if err == nil {
			r.Body.Close()
		}
		inFlight <- err
	}()
	time.Sleep(100 * time.Millisecond)
	sig <- syscall.SIGTERM
	select {
	case code := <-done:
		if code != 0 || !strings.Contains(errOut.String(), "commit-run: stopping") {
			t.Errorf("serve after SIGTERM: exit %d, stderr %q", code, errOut.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("serve still running 15 s after SIGTERM; stderr %q", errOut.String())
	}
	<-inFlight
}

func TestServeBadFlags(t *testing.T) {
	model := needModel(t)
	key := filepath.Join(t.TempDir(), "key")
	os.WriteFile(key, []byte("\n"), 0o600)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--port", "70000"}, "--port 70000"},
		{[]string{"--queue", "-2"}, "--queue -2"},
		{[]string{"--parallel", "0"}, "--parallel 0"},
		{[]string{"--parallel", "100000"}, "--parallel 100000"},
		{[]string{"--parallel", "2", "--device", "sim:rtx4090", "--gpu-mem", "8MiB"}, "KV caches of 2 parallel sequences"},
		{[]string{"--api-key", "a", "--api-key-file", key}, "give one"},
		{[]string{"--api-key-file", key}, "empty"},
		{[]string{"--api-key-file", "/nonexistent/key"}, "--api-key-file"},
		{[]string{"--host", "256.1.1.1", "--port", "0"}, "listen on"},
	} {
		_, errOut, code := runCLI(t, "", append([]string{"serve", "-m", model}, c.args...)...)
		if code == 0 || !strings.Contains(errOut, c.want) {
			t.Errorf("serve %v: exit %d, %q; want an error saying %q", c.args, code, errOut, c.want)
		}
	}
	if _, errOut, code := runCLI(t, "", "serve", "-m", "/nonexistent/model.gguf", "--port", "0"); code == 0 || !strings.Contains(errOut, "model.gguf") {
		t.Errorf("serve a missing model: %d %q", code, errOut)
	}
}
