// Package dl opens the shared libraries the project binds at run time (the CUDA driver, NCCL)
// with purego, and binds their calls to fields holding their addresses: the loading that
// packages cuda and nccl share, so that each keeps only its own tables and errors.
package dl

import (
	"cmp"
	"errors"
	"runtime"
	"strings"
	"unsafe"

	"github.com/ebitengine/purego"
)

// Symbol binds one C function of a library to the field that holds its address.
type Symbol struct {
	Name string
	Addr *uintptr
	// Optional: another version of the library may lack it; callers check Addr.
	Optional bool
}

// Open opens the first of names the dynamic loader finds and returns its handle and name;
// the error lists why each failed.
func Open(names []string) (handle uintptr, path string, err error) {
	var errs []string
	for _, name := range names {
		h, err := dlopen(name)
		if err == nil {
			return h, name, nil
		}
		msg := err.Error()
		if !strings.Contains(msg, name) {
			msg = name + ": " + cmp.Or(msg, "the loader gave no reason")
		}
		errs = append(errs, msg)
	}
	return 0, "", errors.New(strings.Join(errs, "; "))
}

// dlopen is purego.Dlopen on one OS thread: the loader keeps its reason for a failure
// (dlerror) per thread, and purego asks for it in a second call, which the Go scheduler may
// run on another thread, where it reads nothing or another call's reason (a test saw
// "no NCCL library found (; libnccl.so: ...)", the first reason empty).
func dlopen(name string) (uintptr, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return purego.Dlopen(name, purego.RTLD_NOW|purego.RTLD_LOCAL)
}

// Bind looks up every symbol of the tables in the library. It returns the name of the first
// required symbol the library lacks ("" when it has them all), having closed the library.
func Bind(handle uintptr, tables ...[]Symbol) (missing string) {
	for _, t := range tables {
		for _, s := range t {
			addr, err := dlsym(handle, s.Name)
			if err != nil {
				if s.Optional {
					continue
				}
				purego.Dlclose(handle)
				return s.Name
			}
			*s.Addr = addr
		}
	}
	return ""
}

// dlsym is purego.Dlsym on one OS thread, as dlopen.
func dlsym(handle uintptr, name string) (uintptr, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return purego.Dlsym(handle, name)
}

// GoString copies the NUL-terminated C string at p (at most 64 KiB of it): names, messages
// and logs the libraries write.
func GoString(p unsafe.Pointer) string {
	if p == nil {
		return ""
	}
	var b []byte
	for i := 0; i < 1<<16; i++ {
		c := *(*byte)(unsafe.Add(p, i))
		if c == 0 {
			break
		}
		b = append(b, c)
	}
	return string(b)
}
