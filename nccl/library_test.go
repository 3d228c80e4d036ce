package nccl

import (
	"errors"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/commit-run/commit-run/internal/fakenccl"
)

// fakeLibrary loads the fake NCCL of package fakenccl: the binding's calls, argument passing
// and errors are tested against it on machines without GPUs. Tests skip without a C compiler
// to build it.
func fakeLibrary(t *testing.T) *Library {
	t.Helper()
	l, err := Load(fakenccl.ForTests(t))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestLoadWithoutLibrary(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "libnccl.so.2")
	for _, tc := range []struct {
		name, path string
		want       string // in the message
	}{
		{"missing file", missing, missing},
		{"not NCCL", "libc.so.6", "has no ncclGetVersion"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(tc.path)
			if !errors.Is(err, ErrNoLibrary) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Load(%s) = %v, want ErrNoLibrary naming %q", tc.path, err, tc.want)
			}
		})
	}
	t.Run("default names", func(t *testing.T) {
		l, err := Load("")
		if err == nil {
			t.Skipf("an NCCL is installed here: %s, version %s", l.Path(), l.VersionString())
		}
		if !errors.Is(err, ErrNoLibrary) || !strings.Contains(err.Error(), DefaultLibraries[0]) {
			t.Errorf("Load(\"\") = %v, want ErrNoLibrary naming %s", err, DefaultLibraries[0])
		}
	})
}

func TestVersion(t *testing.T) {
	l := fakeLibrary(t)
	if l.Version() != 22304 || l.VersionString() != "2.23.4" {
		t.Errorf("version %d %q, want 22304 2.23.4", l.Version(), l.VersionString())
	}
	if !strings.HasSuffix(l.Path(), "libnccl.so.2") {
		t.Errorf("path %s", l.Path())
	}
	// Versions before 2.9 count minors by hundreds of a thousand.
	for v, want := range map[int]string{2708: "2.7.8", 21903: "2.19.3", 30001: "3.0.1"} {
		if got := (&Library{version: v}).VersionString(); got != want {
			t.Errorf("VersionString(%d) = %s, want %s", v, got, want)
		}
	}
}

func TestResultAndErrorText(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{InvalidUsage, "ncclInvalidUsage"},
		{Result(42), "ncclResult(42)"},
		{&Error{Call: "ncclSend", Result: InvalidUsage, Desc: "invalid usage", Detail: "what"},
			"ncclSend: invalid usage (ncclInvalidUsage): what"},
		{&Error{Call: "ncclRecv", Result: RemoteError}, // no library at hand: the package's text
			"ncclRecv: remote process exited or there was a network error (ncclRemoteError)"},
		{&Error{Call: "ncclGroupEnd", Result: Result(99)}, "ncclGroupEnd:  (ncclResult(99))"},
	} {
		if got := tc.err.Error(); got != tc.want {
			t.Errorf("Error() = %q, want %q", got, tc.want)
		}
	}
	if !errors.Is(&Error{Result: SystemError}, SystemError) || errors.Is(&Error{Result: SystemError}, InternalError) {
		t.Error("errors.Is on Result")
	}
	if Float16.Size() != 2 || BFloat16.String() != "ncclBfloat16" || DataType(10).Size() != 0 {
		t.Error("DataType tables")
	}
}

func TestCommQueries(t *testing.T) {
	l := fakeLibrary(t)
	devices := []int{3, 1, 0}
	comms, err := l.InitAll(devices)
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range comms {
		n, err1 := c.Count()
		r, err2 := c.Rank()
		d, err3 := c.Device()
		if err := errors.Join(err1, err2, err3); err != nil || n != 3 || r != i || d != devices[i] {
			t.Errorf("comm %d: count %d rank %d device %d, %v", i, n, r, d, err)
		}
		if err := c.AsyncError(); err != nil {
			t.Errorf("comm %d: AsyncError = %v", i, err)
		}
		if c.Library() != l {
			t.Errorf("comm %d: Library", i)
		}
	}
	for _, c := range comms {
		if err := c.Destroy(); err != nil {
			t.Error(err)
		}
	}
}

// TestInitError checks that an init call's failure comes back with NCCL's result and message.
func TestInitError(t *testing.T) {
	l := fakeLibrary(t)
	for _, res := range []Result{SystemError, InternalError, InvalidUsage} {
		t.Run(res.String(), func(t *testing.T) {
			t.Setenv("FAKENCCL_INIT_ERROR", strconv.Itoa(int(res)))
			id, err := l.NewUniqueID()
			if err != nil {
				t.Fatal(err)
			}
			for call, init := range map[string]func() error{
				"ncclCommInitAll":          func() error { _, err := l.InitAll([]int{0, 1}); return err },
				"ncclCommInitRankScalable": func() error { _, err := l.InitRank(id, 1, 0); return err },
			} {
				var e *Error
				err := init()
				if !errors.As(err, &e) || e.Result != res || e.Call != call || !strings.Contains(e.Detail, "FAKENCCL_INIT_ERROR") {
					t.Errorf("%s: %v, want an *Error with result %v", call, err, res)
				}
			}
		})
	}
}

func TestInitRankNeedsScalable(t *testing.T) {
	l := fakeLibrary(t)
	old := *l
	old.commInitRankScalable = 0 // as in NCCL before 2.23
	_, err := old.InitRank(UniqueID{}, 2, 0)
	if err == nil || !strings.Contains(err.Error(), "NCCL 2.23 or newer") {
		t.Errorf("InitRank without ncclCommInitRankScalable = %v", err)
	}
}

// TestBadArguments checks that arguments wrong on their face give errors naming the call,
// never panics, whether this package or NCCL refuses them.
func TestBadArguments(t *testing.T) {
	l := fakeLibrary(t)
	comms, err := l.InitAll([]int{0, 1})
	if err != nil {
		t.Fatal(err)
	}
	c := comms[0]
	defer comms[1].Destroy()
	gone, err := l.InitAll([]int{0})
	if err != nil {
		t.Fatal(err)
	}
	if err := gone[0].Destroy(); err != nil {
		t.Fatal(err)
	}
	var nilComm *Comm
	var nilLib *Library
	buf := make([]byte, 64)
	p := addr(buf)
	for _, tc := range []struct {
		name, call string
		want       Result
		f          func() error
	}{
		{"negative count", "ncclSend", InvalidArgument, func() error { return c.Send(p, -1, Uint8, 1, 0) }},
		{"peer out of range", "ncclSend", InvalidArgument, func() error { return c.Send(p, 1, Uint8, 2, 0) }},
		{"negative peer", "ncclRecv", InvalidArgument, func() error { return c.Recv(p, 1, Uint8, -1, 0) }},
		{"unknown type", "ncclRecv", InvalidArgument, func() error { return c.Recv(p, 1, DataType(12), 0, 0) }},
		{"NULL buffer", "ncclSend", InvalidArgument, func() error { return c.Send(0, 4, Float32, 0, 0) }},
		{"nil comm send", "ncclSend", InvalidArgument, func() error { return nilComm.Send(p, 1, Uint8, 0, 0) }},
		{"nil comm recv", "ncclRecv", InvalidArgument, func() error { return nilComm.Recv(p, 1, Uint8, 0, 0) }},
		{"nil comm count", "ncclCommCount", InvalidArgument, func() error { _, err := nilComm.Count(); return err }},
		{"nil comm destroy", "ncclCommDestroy", InvalidArgument, func() error { return nilComm.Destroy() }},
		{"nil comm abort", "ncclCommAbort", InvalidArgument, func() error { return nilComm.Abort() }},
		{"nil comm async", "ncclCommGetAsyncError", InvalidArgument, func() error { return nilComm.AsyncError() }},
		{"nil library", "ncclGroupStart", InvalidArgument, func() error { return nilLib.GroupStart() }},
		{"nil library init", "ncclCommInitAll", InvalidArgument, func() error { _, err := nilLib.InitAll([]int{0}); return err }},
		{"nil library id", "ncclGetUniqueId", InvalidArgument, func() error { _, err := nilLib.NewUniqueID(); return err }},
		{"destroyed comm", "ncclSend", InvalidArgument, func() error { return gone[0].Send(p, 1, Uint8, 0, 0) }},
		{"destroyed comm rank", "ncclCommUserRank", InvalidArgument, func() error { _, err := gone[0].Rank(); return err }},
		{"no devices", "ncclCommInitAll", InvalidArgument, func() error { _, err := l.InitAll(nil); return err }},
		{"negative device", "ncclCommInitAll", InvalidArgument, func() error { _, err := l.InitAll([]int{-1}); return err }},
		{"device twice", "ncclCommInitAll", InvalidUsage, func() error { _, err := l.InitAll([]int{1, 1}); return err }},
		{"no ranks", "ncclCommInitRankScalable", InvalidArgument, func() error { _, err := l.InitRank(UniqueID{}, 0, 0); return err }},
		{"rank out of range", "ncclCommInitRankScalable", InvalidArgument, func() error { _, err := l.InitRank(UniqueID{}, 2, 2); return err }},
		{"foreign id", "ncclCommInitRankScalable", InvalidArgument, func() error { _, err := l.InitRank(UniqueID{1}, 1, 0); return err }},
		{"end without start", "ncclGroupEnd", InvalidUsage, func() error { return l.GroupEnd() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.f()
			var e *Error
			if !errors.As(err, &e) || e.Call != tc.call || e.Result != tc.want || !strings.HasPrefix(err.Error(), tc.call+": ") {
				t.Errorf("%v, want an *Error of %s with %v", err, tc.call, tc.want)
			}
		})
	}
	// Destroying twice is no error; the first Destroy freed it.
	if err := gone[0].Destroy(); err != nil {
		t.Errorf("second Destroy = %v", err)
	}
	if err := c.Destroy(); err != nil {
		t.Error(err)
	}
}
