package dl

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"unsafe"
)

func TestGoString(t *testing.T) {
	long := append([]byte(strings.Repeat("x", 1<<16+10)), 0)
	cases := []struct {
		name string
		b    []byte // nil: a nil pointer
		want string
	}{
		{"nil pointer", nil, ""},
		{"empty", []byte{0}, ""},
		{"a message", []byte("out of memory\x00junk"), "out of memory"},
		{"unterminated within 64 KiB: capped", long, strings.Repeat("x", 1<<16)},
	}
	for _, c := range cases {
		var p unsafe.Pointer
		if c.b != nil {
			p = unsafe.Pointer(&c.b[0])
		}
		if got := GoString(p); got != c.want {
			t.Errorf("%s: %d bytes %.20q, want %d bytes", c.name, len(got), got, len(c.want))
		}
	}
}

// Every failure names its library and says why, also when many goroutines open libraries at
// once and the scheduler moves them between threads: the loader's reason is per thread.
func TestOpenMissingConcurrently(t *testing.T) {
	var wg sync.WaitGroup
	errs := make([]error, 64)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			names := []string{fmt.Sprintf("libcommit-run-missing-%d.so.1", i), "libcommit-run-missing.so"}
			if _, _, err := Open(names); err != nil {
				errs[i] = err
			}
		}()
	}
	wg.Wait()
	for i, err := range errs {
		first := fmt.Sprintf("libcommit-run-missing-%d.so.1: ", i)
		if err == nil || !strings.HasPrefix(err.Error(), first) || !strings.Contains(err.Error(), "; libcommit-run-missing.so: ") ||
			strings.Contains(err.Error(), "gave no reason") || strings.Count(err.Error(), "cannot open") != 2 {
			t.Errorf("open %d: %v, want each library named with its reason", i, err)
		}
	}
}
