package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"

	"github.com/pkg/profile"
)

// startProfile starts a CPU or heap profile written under dir and returns the func that
// stops it (safe to call more than once). mode "" profiles nothing.
func startProfile(mode, dir string, stderr io.Writer) (stop func(), err error) {
	var kind func(*profile.Profile)
	var file string
	switch mode {
	case "":
		return func() {}, nil
	case "cpu":
		kind, file = profile.CPUProfile, "cpu.pprof"
	case "mem":
		kind, file = profile.MemProfile, "mem.pprof"
	default:
		return nil, fmt.Errorf("--profile %q: want cpu or mem", mode)
	}
	// pkg/profile calls log.Fatal when it cannot create its file; check first so the user
	// gets our one-line error and the normal exit path instead.
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("--profile-dir: %w", err)
	}
	probe, err := os.CreateTemp(dir, ".commit-run-profile-*")
	if err != nil {
		return nil, fmt.Errorf("--profile-dir %s is not writable: %w", dir, err)
	}
	probe.Close()
	os.Remove(probe.Name())

	// NoShutdownHook: pkg/profile's own SIGINT hook would exit the process on the first
	// Ctrl-C, which in chat must only cancel the current reply. run stops the profile instead.
	p := profile.Start(kind, profile.ProfilePath(dir), profile.NoShutdownHook, profile.Quiet)
	var once sync.Once
	return func() {
		once.Do(func() {
			p.Stop()
			fmt.Fprintf(stderr, "profile written to %s\n", filepath.Join(dir, file))
		})
	}, nil
}
