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
			_, s, closeAll, err := a.session()
			if err != nil {
				return err
			}
			defer closeAll()
			return a.chatLoop(cmd.Context(), s, system, opts, isTerminal(a.stdin))
		},
	}
	cmd.Flags().StringVar(&system, "system", "", "system message `TEXT` that opens the conversation")
	g.register(cmd.Flags(), false)
	return cmd
}

// chatLoop reads user turns until /exit, EOF or Ctrl-C at the prompt. interactive turns on the
// prompt and banner and makes engine errors non-fatal (the user can /reset and go on).
func (a *app) chatLoop(ctx context.Context, s *engine.Session, system string, opts engine.GenerateOptions, interactive bool) error {
	ctx, quit := context.WithCancel(ctx)
	defer quit()

	// Ctrl-C cancels the reply being generated if there is one, else ends the chat.
	var mu sync.Mutex
	var cancelReply context.CancelFunc
	defer a.interrupts.set(func() {
		mu.Lock()
		defer mu.Unlock()
		if cancelReply != nil {
			cancelReply()
			return
		}
		quit()
	})()

	done := make(chan struct{})
	defer close(done)
	lines := readLines(a.stdin, done)

	var start []engine.Message
	if system != "" {
		start = []engine.Message{{Role: "system", Content: system}}
	}
	history := append([]engine.Message(nil), start...)
	if interactive {
		fmt.Fprintln(a.stderr, chatHelp)
	}
	opts.OnToken = func(t engine.Token) error {
		_, err := io.WriteString(a.stdout, t.Text)
		return err
	}
	for {
		if interactive {
			fmt.Fprint(a.stdout, "> ")
		}
		var line string
		var ok bool
		select {
		case <-ctx.Done():
			if interactive {
				fmt.Fprintln(a.stdout)
			}
			return nil
		case line, ok = <-lines:
		}
		if !ok { // EOF (Ctrl-D)
			if interactive {
				fmt.Fprintln(a.stdout)
			}
			return nil
		}
		line = strings.TrimSpace(line)
		switch {
		case line == "":
			continue
		case line == "/exit" || line == "/quit":
			return nil
		case line == "/reset":
			history = append(history[:0:0], start...)
			s.Reset()
			if interactive {
				fmt.Fprintln(a.stderr, "(conversation cleared)")
			}
			continue
		case strings.HasPrefix(line, "/") && !strings.ContainsAny(line, " \t"):
			// A lone "/word" is almost surely a mistyped command, not a message.
			fmt.Fprintf(a.stderr, "unknown command %s; %s\n", line, chatHelp)
			continue
		}

		history = append(history, engine.Message{Role: "user", Content: line})
		replyCtx, cancel := context.WithCancel(ctx)
		mu.Lock()
		cancelReply = cancel
		mu.Unlock()
		res, err := s.Chat(replyCtx, history, opts)
		mu.Lock()
		cancelReply = nil
		mu.Unlock()
		interrupted := replyCtx.Err() != nil && ctx.Err() == nil
		cancel()
		fmt.Fprintln(a.stdout)

		switch {
		case err == nil:
			history = append(history, engine.Message{Role: "assistant", Content: res.Text})
		case ctx.Err() != nil: // SIGTERM: stop everything
			return ctx.Err()
		case interrupted && errors.Is(err, context.Canceled):
			fmt.Fprintln(a.stderr, "(reply interrupted)")
			// Keep what the user saw, so the next turn's history matches the screen.
			if res.Text != "" {
				history = append(history, engine.Message{Role: "assistant", Content: res.Text})
			} else {
				history = history[:len(history)-1]
			}
		default:
			history = history[:len(history)-1]
			if !interactive {
				return err
			}
			fmt.Fprintf(a.stderr, "error: %v\n", err)
		}
	}
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
