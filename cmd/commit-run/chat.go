package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"

	"github.com/spf13/cobra"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/toolcall"
)

const chatHelp = "commands: /reset clears the conversation, /exit (or Ctrl-D) quits; Ctrl-C stops a reply, or quits at the prompt"

func (a *app) chatCmd() *cobra.Command {
	var (
		g      genFlags
		system string
	)
	cmd := &cobra.Command{
		Use:   "chat",
		Short: "Chat with the model, streaming each reply (one reply per line when stdin is piped)",
		Long: "chat keeps a multi-turn conversation rendered with the model's chat template.\n" + chatHelp + ".\n" +
			"When stdin is not a terminal, every input line is one user turn and gets one reply line.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts, err := g.options()
			if err != nil {
				return err
			}
			m, s, closeAll, err := a.session()
			if err != nil {
				return err
			}
			defer closeAll()
			return a.chatLoop(cmd.Context(), s, m.ToolFormat(), system, opts, isTerminal(a.stdin))
		},
	}
	cmd.Flags().StringVar(&system, "system", "", "system message `TEXT` that opens the conversation")
	g.register(cmd.Flags(), false)
	return cmd
}

// chatLoop reads user turns until /exit, EOF or Ctrl-C at the prompt. interactive turns on the
// prompt and banner and makes engine errors non-fatal (the user can /reset and go on).
func (a *app) chatLoop(ctx context.Context, s *engine.Session, format toolcall.Format, system string, opts engine.GenerateOptions, interactive bool) error {
	ctx, quit := context.WithCancel(ctx)
	defer quit()

	c := &conversation{a: a, s: s, format: format, opts: opts, interactive: interactive}
	// Ctrl-C cancels the reply being generated if there is one, else ends the chat.
	defer a.interrupts.set(func() { c.interrupt(quit) })()

	done := make(chan struct{})
	defer close(done)
	lines := readLines(a.stdin, done)

	if system != "" {
		c.start = []engine.Message{{Role: "system", Content: system}}
	}
	c.history = append([]engine.Message(nil), c.start...)
	if interactive {
		fmt.Fprintln(a.stderr, chatHelp)
	}
	c.opts.OnToken = func(t engine.Token) error {
		text := t.Text
		if c.channels != nil {
			// A harmony model's reasoning goes to stderr, its answer to stdout.
			d := c.channels.Add(text)
			if d.Reasoning != "" {
				io.WriteString(a.stderr, d.Reasoning)
			}
			text = d.Content
		}
		_, err := io.WriteString(a.stdout, text)
		return err
	}
	for {
		line, ok := c.readTurn(ctx, lines)
		if !ok {
			return nil
		}
		line = strings.TrimSpace(line)
		if line == "/exit" || line == "/quit" {
			return nil
		}
		if c.command(line) {
			continue
		}
		if err := c.reply(ctx, line); err != nil {
			return err
		}
	}
}

// conversation is what the steps of a chat share: the turns so far, and the reply being
// generated, which Ctrl-C stops.
type conversation struct {
	a           *app
	s           *engine.Session
	opts        engine.GenerateOptions
	interactive bool
	start       []engine.Message // what /reset goes back to: the system message, if any
	history     []engine.Message
	// format is the model's answer format; channels reads a reply whose text is channels of
	// markup (gpt-oss's harmony), nil for plain text.
	format   toolcall.Format
	channels *toolcall.Parser

	mu          sync.Mutex
	cancelReply context.CancelFunc // nil at the prompt
}

// interrupt stops the reply being generated, or calls quit at the prompt. The lock keeps a
// reply from starting in between.
func (c *conversation) interrupt(quit func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cancelReply != nil {
		c.cancelReply()
		return
	}
	quit()
}

// setReply records the cancel of the reply being generated (nil when it is over), for
// interrupt.
func (c *conversation) setReply(cancel context.CancelFunc) {
	c.mu.Lock()
	c.cancelReply = cancel
	c.mu.Unlock()
}

// readTurn shows the prompt and waits for the user's next line, or for the chat to end: at
// EOF (Ctrl-D) or on Ctrl-C, when it reports false.
func (c *conversation) readTurn(ctx context.Context, lines <-chan string) (string, bool) {
	if c.interactive {
		fmt.Fprint(c.a.stdout, "> ")
	}
	var line string
	var ok bool
	select {
	case <-ctx.Done():
	case line, ok = <-lines:
	}
	if !ok && c.interactive {
		fmt.Fprintln(c.a.stdout) // the shell's prompt starts on a line of its own
	}
	return line, ok
}

// command carries out a line that is no message for the model: a blank one, /reset, or a
// mistyped command. It reports whether line was one.
func (c *conversation) command(line string) bool {
	switch {
	case line == "":
	case line == "/reset":
		c.history = append(c.history[:0:0], c.start...)
		c.s.Reset()
		if c.interactive {
			fmt.Fprintln(c.a.stderr, "(conversation cleared)")
		}
	case strings.HasPrefix(line, "/") && !strings.ContainsAny(line, " \t"):
		// A lone "/word" is almost surely a mistyped command, not a message.
		fmt.Fprintf(c.a.stderr, "unknown command %s; %s\n", line, chatHelp)
	default:
		return false
	}
	return true
}

// reply streams the model's answer to the user's line and keeps the turn in the history. An
// error it returns ends the chat: SIGTERM always, an engine error when no one is at a
// terminal to /reset and go on.
func (c *conversation) reply(ctx context.Context, line string) error {
	c.history = append(c.history, engine.Message{Role: "user", Content: line})
	replyCtx, cancel := context.WithCancel(ctx)
	c.setReply(cancel)
	if toolcall.Always(c.format) {
		c.channels = toolcall.NewParser(c.format)
	}
	res, err := c.s.Chat(replyCtx, c.history, c.opts)
	if c.channels != nil {
		io.WriteString(c.a.stdout, c.channels.Finish().Content)
		res.Text, c.channels = c.channels.Content(), nil // the history keeps the answer, as the template wants it
	}
	c.setReply(nil)
	interrupted := replyCtx.Err() != nil && ctx.Err() == nil
	cancel()
	fmt.Fprintln(c.a.stdout)

	switch {
	case err == nil:
		c.history = append(c.history, engine.Message{Role: "assistant", Content: res.Text})
	case ctx.Err() != nil: // SIGTERM: stop everything
		return ctx.Err()
	case interrupted && errors.Is(err, context.Canceled):
		fmt.Fprintln(c.a.stderr, "(reply interrupted)")
		// Keep what the user saw, so the next turn's history matches the screen.
		if res.Text != "" {
			c.history = append(c.history, engine.Message{Role: "assistant", Content: res.Text})
		} else {
			c.history = c.history[:len(c.history)-1]
		}
	default:
		c.history = c.history[:len(c.history)-1]
		if !c.interactive {
			return err
		}
		fmt.Fprintf(c.a.stderr, "error: %v\n", err)
	}
	return nil
}

// readLines delivers stdin line by line on a channel, closed at EOF, so that the chat loop can
// wait for input and for Ctrl-C at once. done stops the reader when the loop returns early.
func readLines(r io.Reader, done <-chan struct{}) <-chan string {
	ch := make(chan string)
	go func() {
		defer close(ch)
		br := bufio.NewReader(r)
		for {
			line, err := br.ReadString('\n')
			if line != "" {
				select {
				case ch <- line:
				case <-done:
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	return ch
}
