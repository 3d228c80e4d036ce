package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// isTerminal reports whether w is a character device (a terminal). Checking the file mode
// avoids a dependency on golang.org/x/term for the one question we ask.
func isTerminal(w any) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// progressBar draws "label [#####-----]  42%  1.2 GiB / 2.9 GiB" on one terminal line.
// It is our own rather than a library's: it is one redraw function, and the engine calls it
// from the loading goroutine(s), so it needs only a mutex and a redraw throttle.
type progressBar struct {
	mu    sync.Mutex
	w     io.Writer
	label string
	last  time.Time
	drawn bool
}

func newProgressBar(w io.Writer, label string) *progressBar {
	return &progressBar{w: w, label: label}
}

// update is an engine.Options.Progress callback.
func (p *progressBar) update(done, total int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	// Redrawing on every callback would make the terminal the bottleneck of a fast load.
	if done < total && now.Sub(p.last) < 50*time.Millisecond {
		return
	}
	p.last = now
	const width = 30
	frac := 0.0
	if total > 0 {
		frac = min(max(float64(done)/float64(total), 0), 1)
	}
	n := int(frac * width)
	fmt.Fprintf(p.w, "\r%s [%s%s] %3.0f%%  %s / %s ", p.label,
		strings.Repeat("#", n), strings.Repeat("-", width-n), 100*frac,
		humanBytes(done), humanBytes(total))
	p.drawn = true
}

// finish erases the bar so that what follows starts on a clean line.
func (p *progressBar) finish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drawn {
		fmt.Fprint(p.w, "\r\033[K")
	}
}
