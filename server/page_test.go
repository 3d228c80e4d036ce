package server_test

import (
	"context"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/offload"
	"github.com/commit-run/commit-run/server"
)

// browser finds a Chromium or Chrome to drive, or skips the test saying why.
func browser(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Skip("no Chromium or Chrome on PATH (Debian: apt-get install chromium; .ci/run installs it)")
	return ""
}

// TestChatPage opens the chat page in headless Chromium, sends two turns as a user would, and
// reads back the streamed replies and the figures the page draws for each: tokens/s and the
// expert cache hit rate of an offloading model. The page needs the API key the user types,
// and loads without one.
func TestChatPage(t *testing.T) {
	exe := browser(t)
	m, err := engine.Open(bundled, engine.Options{Threads: 2, KVType: "f32", ContextLength: 256,
		Offload: &engine.OffloadOptions{Policy: offload.OnDemand, GPUMem: 40 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	url := serve(t, m, server.Options{APIKey: "sesame", LocalOnly: true})

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(exe), chromedp.NoSandbox, chromedp.Headless)
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancel()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	ctx, cancel = context.WithTimeout(ctx, 90*time.Second)
	defer cancel()

	step := func(what string, a chromedp.Action[chromedp.Void]) {
		t.Helper()
		if _, err := chromedp.Run(ctx, a); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	text := func(sel chromedp.Search) string {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Text(sel))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return v
	}
	attr := func(sel chromedp.Search, name string) string {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.AttributeValue(sel, name))
		if err != nil {
			t.Fatalf("%s of %s: %v", name, sel, err)
		}
		return v.Value
	}
	step("open the page", chromedp.Navigate(url+"/"))
	step("wait for the prompt box", chromedp.WaitVisible(chromedp.ID("prompt")))
	step("type the key", chromedp.SendKeys(chromedp.ID("key"), "sesame"))
	for turn, msg := range []string{"Tell me of the old prince.", "And then?"} {
		step("type a message", chromedp.SendKeys(chromedp.ID("prompt"), msg))
		step("send it", chromedp.Click(chromedp.ID("send")))
		done := chromedp.Search(`(//div[contains(@class,"assistant") and @data-done="true"])[` + strconv.Itoa(turn+1) + `]`)
		step("wait for the reply", chromedp.WaitVisible(done))
		reply := text(done)
		stats := chromedp.Search(`(//div[@class="stats"])[` + strconv.Itoa(turn+1) + `]`)
		tokens, rate, hit := attr(stats, "data-tokens"), attr(stats, "data-rate"), attr(stats, "data-hit")
		n, _ := strconv.Atoi(tokens)
		r, _ := strconv.ParseFloat(rate, 64)
		h, err := strconv.ParseFloat(hit, 64)
		if strings.TrimSpace(reply) == "" || n < 2 || !(r > 0) || err != nil || h < 0 || h > 1 {
			t.Errorf("turn %d: reply %q, %s tokens at %s tokens/s, hit rate %q", turn, reply, tokens, rate, hit)
		}
	}
	model := text(chromedp.Search(`//*[@id="model"]`))
	if model != "tinymoe-qwen2moe" {
		t.Errorf("the page names the model %q", model)
	}
}
