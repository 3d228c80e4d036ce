package server_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
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
// reads back the streamed replies and the figures the page draws for each: tokens/s (the
// server's timings), the expert cache hit rate and live view of an offloading model, the
// context's fill. Then a stopped generation, a conversation that outgrows the context, a new
// chat, and a markdown reply with its code block copied; a screenshot goes to the test's
// temporary directory. The page needs the API key the user types, and loads without one.
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
	eval := func(what, js string, out any) {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Evaluate[json.RawMessage](js))
		if err == nil && out != nil {
			err = json.Unmarshal(v, out)
		}
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	var n int
	eval("the context meter", `Number(document.getElementById("ctx").dataset.used || 0)`, &n)
	if n <= 0 || n > 256 {
		t.Errorf("the context meter says %d tokens used of 256", n)
	}
	eval("the expert cache view", `document.getElementById("experts").hidden ? -1 : Number(document.getElementById("cachemap").dataset.resident || 0)`, &n)
	if n <= 0 {
		t.Errorf("the expert cache view shows %d resident experts", n)
	}

	// Stop: a generation stopped at once keeps the conversation usable.
	eval("short replies", `document.getElementById("max_tokens").value = "24"`, nil)
	step("type a message", chromedp.SendKeys(chromedp.ID("prompt"), "Who was at Bald Hills?"))
	eval("send and stop", `document.getElementById("form").requestSubmit(); document.getElementById("stop").click(); true`, nil)
	step("wait for the stopped reply", chromedp.WaitVisible(chromedp.Search(`//div[contains(@class,"assistant") and @data-stopped="true"]`)))

	// A long conversation: the context outgrows 256 tokens, the server leaves the oldest
	// turns out, the page says so, and every turn is answered.
	for turn := 0; turn < 10; turn++ {
		eval("count the replies", `document.querySelectorAll('div.assistant[data-done="true"]').length`, &n)
		step("type a message", chromedp.SendKeys(chromedp.ID("prompt"), "Tell me more of the old prince and his daughter, please."))
		step("send it", chromedp.Click(chromedp.ID("send")))
		step("wait for the reply", chromedp.WaitVisible(chromedp.Search(`(//div[contains(@class,"assistant") and @data-done="true"])[`+strconv.Itoa(n+1)+`]`)))
	}
	eval("the trimmed note", `document.querySelectorAll(".note[data-trimmed]").length`, &n)
	if n == 0 {
		t.Error("a conversation beyond the context: no note that older turns were left out")
	}
	eval("errors", `document.querySelectorAll(".error").length`, &n)
	if n != 0 {
		t.Errorf("%d errors in a long conversation", n)
	}

	// New chat: an empty log, and both conversations listed.
	step("new chat", chromedp.Click(chromedp.ID("new")))
	eval("the log", `document.querySelectorAll("#log .msg").length`, &n)
	var chats int
	eval("the list", `document.querySelectorAll("#chats button.chat").length`, &chats)
	if n != 0 || chats != 2 {
		t.Errorf("a new chat: %d messages shown, %d conversations listed; want 0 and 2", n, chats)
	}

	// Markdown: a reply kept in the browser renders with its code block and copy button
	// after a reload.
	reply := "## Example\n\nA **bold** word and `code`:\n\n```go\nfmt.Println(\"<b>hi</b>\")\n```\n\n- one\n- two"
	js, _ := json.Marshal(reply)
	eval("keep a markdown reply", `(() => {
		const c = JSON.parse(localStorage.getItem("commit-run-chats"));
		c[0].messages = [{role: "user", content: "Show me Go"}, {role: "assistant", content: `+string(js)+`}];
		localStorage.setItem("commit-run-chats", JSON.stringify(c)); return true; })()`, nil)
	step("reload", chromedp.Reload())
	step("wait for the code block", chromedp.WaitVisible(chromedp.Search(`//div[contains(@class,"assistant")]//pre/code`)))
	var md struct {
		Code, Heading, Bold string
		Items               int
	}
	eval("the rendered reply", `(() => { const a = document.querySelector("div.assistant");
		return {Code: a.querySelector("pre code").textContent, Heading: (a.querySelector("h4") || {}).textContent || "",
			Bold: (a.querySelector("b") || {}).textContent || "", Items: a.querySelectorAll("li").length}; })()`, &md)
	if md.Code != `fmt.Println("<b>hi</b>")` || md.Heading != "Example" || md.Bold != "bold" || md.Items != 2 {
		t.Errorf("the markdown reply rendered as %+v", md)
	}
	step("copy the code", chromedp.Click(chromedp.Search(`//button[@class="copy"]`)))
	step("wait for the copy", chromedp.WaitVisible(chromedp.Search(`//button[@class="copy" and @data-copied="true"]`)))

	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	shot := filepath.Join(t.TempDir(), "chat.png")
	if err := os.WriteFile(shot, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes)", shot, len(png))
}
