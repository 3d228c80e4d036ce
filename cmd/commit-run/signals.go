package main

import (
	"os"
	"sync"
	"syscall"
)

// interrupts gives Ctrl-C a meaning that depends on what the program is doing. By default
// the first Ctrl-C cancels the command's context (the engine stops at its next check and the
// command returns, so deferred cleanup and the profile writer run) and a second one exits at
// once. The chat command overrides it: Ctrl-C during a reply cancels only that reply.
type interrupts struct {
	mu       sync.Mutex
	cancel   func() // cancels the root context
	force    func() // hard exit on a repeated Ctrl-C
	handler  func() // the current command's meaning of Ctrl-C; nil = default
	canceled bool
}

func newInterrupts(cancel, force func()) *interrupts {
	return &interrupts{cancel: cancel, force: force}
}

// serve dispatches signals until done is closed.
func (in *interrupts) serve(sig <-chan os.Signal, done <-chan struct{}) {
	for {
		select {
		case s := <-sig:
			in.deliver(s)
		case <-done:
			return
		}
	}
}

// deliver acts on one signal. SIGTERM always means "stop everything": a service manager is
// not asking to cancel one chat reply.
func (in *interrupts) deliver(s os.Signal) {
	in.mu.Lock()
	h := in.handler
	if s == syscall.SIGTERM {
		h = nil
	}
	if h == nil {
		if in.canceled {
			in.mu.Unlock()
			in.force()
			return
		}
		in.canceled = true
	}
	in.mu.Unlock()
	if h != nil {
		h()
		return
	}
	in.cancel()
}

// set installs fn as the meaning of Ctrl-C until the returned restore is called.
func (in *interrupts) set(fn func()) (restore func()) {
	in.mu.Lock()
	prev := in.handler
	in.handler = fn
	in.mu.Unlock()
	return func() {
		in.mu.Lock()
		in.handler = prev
		in.mu.Unlock()
	}
}
