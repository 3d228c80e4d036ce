package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestReaders(t *testing.T) {
	b := bytes.Repeat([]byte{1}, 1000) // 125 words of 0x0101010101010101, no 0xA5
	if got, want := sumWords(b), uint64(125)*0x0101010101010101; got != want {
		t.Errorf("sumWords = %#x, want %#x", got, want)
	}
	if got := sumWords(b[:13]); got != 0x0101010101010101 {
		t.Errorf("sumWords of 13 bytes = %#x (one whole word)", got)
	}
	b[999] = 0xA5
	for _, r := range readers[1:] {
		if got := r.Read(b); got != 1000 && got != 1 {
			t.Errorf("%s = %d", r.Name, got)
		}
	}
}

// TestMeasureBandwidth streams a small buffer: it checks the mechanics, not the rate.
func TestMeasureBandwidth(t *testing.T) {
	bw, err := measureBandwidth(2, 8<<20, 1)
	if err != nil {
		t.Fatal(err)
	}
	if bw.Threads != 2 || bw.BufferBytes != 8<<20 || len(bw.Rates) != len(readers) || bw.GBps <= 0 {
		t.Fatalf("bandwidth %+v", bw)
	}
	for _, r := range bw.Rates {
		if r.GBps <= 0 || r.GBps > bw.GBps {
			t.Errorf("reader %s: %g GB/s beside the best %g", r.Reader, r.GBps, bw.GBps)
		}
	}
	for _, c := range []struct {
		threads int
		size    int64
		reps    int
		err     string
	}{
		{0, 8 << 20, 1, "at least 1"},
		{1, 8 << 20, 0, "at least 1"},
		{4, 1 << 20, 1, "too small"},
	} {
		if _, err := measureBandwidth(c.threads, c.size, c.reps); err == nil || !strings.Contains(err.Error(), c.err) {
			t.Errorf("measureBandwidth(%d, %d, %d) error %v, want %q", c.threads, c.size, c.reps, err, c.err)
		}
	}
}
