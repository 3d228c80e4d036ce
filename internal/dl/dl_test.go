package dl

import (
	"strings"
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
