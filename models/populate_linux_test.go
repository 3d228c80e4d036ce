package models

import (
	"bytes"
	"os"
	"syscall"
	"testing"
	"unsafe"
)

// TestPopulate: every tensor of a file populates, whatever its offset in the pages, and reads
// back what the file holds.
func TestPopulate(t *testing.T) {
	const path = "testdata/tinymoe-qwen2moe.gguf"
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// The first page of the mapping, aligned: EINVAL there means the kernel lacks it.
	page := f.mapping[:syscall.Getpagesize()]
	if _, _, e := syscall.Syscall(syscall.SYS_MADVISE, uintptr(unsafe.Pointer(&page[0])), uintptr(len(page)), madvPopulateRead); e == syscall.EINVAL {
		t.Skip("this kernel has no MADV_POPULATE_READ (Linux 5.14)")
	}
	for _, tn := range f.Tensors {
		if err := f.Populate(tn); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(tn.Data, raw[tn.start:tn.end]) {
			t.Fatalf("tensor %s reads back other bytes after populating", tn.Name)
		}
	}
}
