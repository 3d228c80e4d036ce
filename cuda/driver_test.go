package cuda

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/commit-run/commit-run/internal/fakecuda"
	"github.com/ebitengine/purego"
)

var fake struct{ path string }

// fakeDriver loads the fake driver of package fakecuda: the binding's calls, argument passing
// and errors are tested against it on machines without a GPU. Tests skip without a C
// compiler to build it.
func fakeDriver(t *testing.T) *Driver {
	t.Helper()
	path := fakecuda.ForTests(t)
	fake.path = path
	d, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func fakeContext(t *testing.T) *Context {
	t.Helper()
	d := fakeDriver(t)
	dev, err := d.Device(0)
	if err != nil {
		t.Fatal(err)
	}
	c, err := dev.Retain()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Release() })
	return c
}

func TestLoadWithoutDriver(t *testing.T) {
	for _, path := range []string{filepath.Join(t.TempDir(), "libcuda.so.1"), "libc.so.6"} {
		_, err := Load(path)
		if !errors.Is(err, ErrNoDriver) || !strings.Contains(err.Error(), "no CUDA driver found") {
			t.Errorf("Load(%s) = %v, want ErrNoDriver", path, err)
		}
	}
	// libc loads but is not a driver: the error names the missing call.
	if _, err := Load("libc.so.6"); err == nil || !strings.Contains(err.Error(), "has no cuInit") {
		t.Errorf("Load(libc) = %v, want it to name cuInit", err)
	}
}

func TestDevices(t *testing.T) {
	d := fakeDriver(t)
	if d.Version() != 13000 || d.Path() != fake.path {
		t.Errorf("version %d path %s", d.Version(), d.Path())
	}
	n, err := d.Count()
	if err != nil || n != 1 {
		t.Fatalf("Count = %d, %v", n, err)
	}
	dev, err := d.Device(0)
	if err != nil {
		t.Fatal(err)
	}
	in, err := dev.Info()
	if err != nil {
		t.Fatal(err)
	}
	want := Info{Ordinal: 0, Name: "Fake GPU", Memory: 1 << 30, Major: 8, Minor: 9, SMs: 128, ClockKHz: 2520000,
		MemClockKHz: 10501000, BusWidth: 384, L2: 72 << 20, PCI: "0000:01:00.0", MemoryBandwidth: 2 * 10501000e3 * 384 / 8}
	if in != want {
		t.Errorf("Info = %+v\nwant %+v", in, want)
	}
	if s := in.String(); !strings.Contains(s, "cuda:0  Fake GPU  1.0 GiB  sm_89  128 SMs  1008 GB/s") {
		t.Errorf("String = %q", s)
	}
	for _, ord := range []int{1, -1} {
		if _, err := d.Device(ord); err == nil || !strings.Contains(err.Error(), "sees 1") {
			t.Errorf("Device(%d) = %v, want an error saying how many there are", ord, err)
		}
	}

	t.Setenv("FAKECUDA_DEVICES", "0")
	if n, err := d.Count(); n != 0 || err != nil {
		t.Errorf("no devices: Count = %d, %v", n, err)
	}
	if _, err := d.Device(0); err == nil || !strings.Contains(err.Error(), "no CUDA device 0") {
		t.Errorf("no devices: Device(0) = %v", err)
	}
}

func TestInitError(t *testing.T) {
	fakeDriver(t)
	t.Setenv("FAKECUDA_INIT_ERROR", "100")
	_, err := Load(fake.path)
	var e *Error
	if !errors.As(err, &e) || e.Call != "cuInit" || e.Name != "CUDA_ERROR_NO_DEVICE" || !errors.Is(err, ErrNoDevice) {
		t.Fatalf("Load with a failing cuInit = %v", err)
	}
	if got := err.Error(); got != "cuInit: CUDA_ERROR_NO_DEVICE (100)" {
		t.Errorf("message %q", got)
	}
}

func TestMemory(t *testing.T) {
	c := fakeContext(t)
	s, err := c.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()
	free0, total, err := c.MemInfo()
	if err != nil || total != 1<<30 {
		t.Fatalf("MemInfo = %d %d %v", free0, total, err)
	}
	a, err := c.Alloc(64)
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.Alloc(64)
	if err != nil {
		t.Fatal(err)
	}
	if free, _, _ := c.MemInfo(); free != free0-128 {
		t.Errorf("free %d after 128 bytes, was %d", free, free0)
	}
	src := make([]byte, 64)
	for i := range src {
		src[i] = byte(i)
	}
	got := make([]byte, 64)
	steps := []error{
		s.CopyHtoD(a, src),
		s.Memset(a.Add(8), 0xff, 4),
		s.CopyDtoD(b, a, 64),
		s.CopyDtoH(got, b),
		s.Synchronize(),
	}
	if err := errors.Join(steps...); err != nil {
		t.Fatal(err)
	}
	want := bytes.Clone(src)
	copy(want[8:12], []byte{0xff, 0xff, 0xff, 0xff})
	if !bytes.Equal(got, want) {
		t.Errorf("round trip = %v, want %v", got, want)
	}
	if err := errors.Join(c.Free(a), c.Free(b), c.Free(0)); err != nil {
		t.Error(err)
	}
	if err := c.Free(a); !errors.Is(err, ErrInvalidValue) || !strings.Contains(err.Error(), "cuMemFree_v2") {
		t.Errorf("double free = %v", err)
	}
	if _, err := c.Alloc(0); err == nil {
		t.Error("Alloc(0) succeeded")
	}
}

func TestOutOfMemory(t *testing.T) {
	c := fakeContext(t)
	t.Setenv("FAKECUDA_MEM", "1000")
	_, err := c.Alloc(4096)
	if !errors.Is(err, ErrOutOfMemory) {
		t.Fatalf("Alloc over the card = %v", err)
	}
	for _, s := range []string{"cuda:0", "4096 bytes", "cuMemAlloc_v2", "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("%q does not say %q", err, s)
		}
	}
}

// TestContextOnAnyThread checks that every call makes the context current itself: goroutines
// on threads where no context, or another one, is current still reach the device.
func TestContextOnAnyThread(t *testing.T) {
	c := fakeContext(t)
	setCurrent, err := purego.Dlsym(c.d.handle, "cuCtxSetCurrent")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				runtime.LockOSThread()
				purego.SyscallN(setCurrent, 0) // this thread now has no context
				runtime.UnlockOSThread()
				p, err := c.Alloc(16)
				if err == nil {
					err = c.Free(p)
				}
				if err != nil {
					errs <- err
					return
				}
				runtime.Gosched()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func TestHostMemory(t *testing.T) {
	c := fakeContext(t)
	h, err := c.HostAlloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Bytes) != 4096 {
		t.Fatalf("pinned buffer of %d bytes", len(h.Bytes))
	}
	h.Bytes[4095] = 7
	if err := errors.Join(h.Free(), h.Free()); err != nil {
		t.Error(err)
	}
	buf := make([]byte, 1<<16)
	r, err := c.Register(buf, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(r.Unregister(), r.Unregister()); err != nil {
		t.Error(err)
	}
	if _, err := c.Register(nil, false); err == nil {
		t.Error("registering nothing succeeded")
	}
	if _, err := c.HostAlloc(0); err == nil {
		t.Error("HostAlloc(0) succeeded")
	}
}

func TestEvents(t *testing.T) {
	c := fakeContext(t)
	s, err := c.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()
	a, _ := c.NewEvent(true)
	b, _ := c.NewEvent(true)
	o, err := c.NewEvent(false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Elapsed(a, b); !errors.Is(err, Result(400)) {
		t.Errorf("Elapsed of unrecorded events = %v", err)
	}
	if err := errors.Join(a.Record(s), o.Record(s), s.Wait(o), b.Record(s), b.Synchronize()); err != nil {
		t.Fatal(err)
	}
	if done, err := b.Done(); !done || err != nil {
		t.Errorf("Done = %v, %v", done, err)
	}
	if sec, err := Elapsed(a, b); err != nil || sec < 0 || sec > 1 {
		t.Errorf("Elapsed = %v, %v", sec, err)
	}
	if err := errors.Join(a.Destroy(), b.Destroy(), o.Destroy(), o.Destroy()); err != nil {
		t.Error(err)
	}
}

func TestModuleAndLaunch(t *testing.T) {
	c := fakeContext(t)
	s, err := c.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()
	_, err = c.LoadModule([]byte(".version 8.0\nsyntax error here"))
	var e *Error
	if !errors.As(err, &e) || e.Result != ErrInvalidPTX || !strings.Contains(e.Log, "Parsing error near 'syntax'") {
		t.Fatalf("loading bad PTX = %v", err)
	}
	m, err := c.LoadModule([]byte("// fake module"))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Unload()
	if _, err := m.Function("missing"); !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "kernel missing") {
		t.Errorf("Function(missing) = %v", err)
	}
	axpy, err := m.Function("fake_axpy")
	if err != nil {
		t.Fatal(err)
	}
	if err := axpy.SetMaxDynamicShared(96 << 10); err != nil {
		t.Error(err)
	}

	const n = 100
	x, y := make([]float32, n), make([]float32, n)
	for i := range x {
		x[i], y[i] = float32(i), 1
	}
	dx, _ := c.Alloc(4 * n)
	dy, _ := c.Alloc(4 * n)
	defer c.Free(dx)
	defer c.Free(dy)
	if err := errors.Join(s.CopyHtoD(dx, f32bytes(x)), s.CopyHtoD(dy, f32bytes(y))); err != nil {
		t.Fatal(err)
	}
	var args Args
	if err := s.Launch(axpy, Dim3{3, 2, 0}, Dim3{X: 128}, 256, args.Float(2.5).Ptr(dx).Ptr(dy).Int(n)); err != nil {
		t.Fatal(err)
	}
	out := make([]byte, 4*n)
	if err := errors.Join(s.CopyDtoH(out, dy), s.Synchronize()); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		if got := math.Float32frombits(binary.LittleEndian.Uint32(out[4*i:])); got != 1+2.5*float32(i) {
			t.Fatalf("y[%d] = %v, want %v", i, got, 1+2.5*float32(i))
		}
	}
	lastFn, err := purego.Dlsym(c.d.handle, "fake_last_launch")
	if err != nil {
		t.Fatal(err)
	}
	var last [8]uint32
	purego.SyscallN(lastFn, uintptr(unsafe.Pointer(&last[0])))
	if last != [8]uint32{3, 2, 1, 128, 1, 1, 256, 1} {
		t.Errorf("launch configuration %v", last)
	}

	// Reused arguments, a 64-bit one among them.
	iota, err := m.Function("fake_iota64")
	if err != nil {
		t.Fatal(err)
	}
	d64, _ := c.Alloc(8 * 4)
	defer c.Free(d64)
	if err := s.Launch(iota, Dim3{X: 1}, Dim3{X: 1}, 0, args.Reset().Int64(1<<40+5).Ptr(d64).Int(4)); err != nil {
		t.Fatal(err)
	}
	out = make([]byte, 32)
	if err := s.CopyDtoH(out, d64); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4; i++ {
		if got := int64(binary.LittleEndian.Uint64(out[8*i:])); got != 1<<40+5+int64(i) {
			t.Errorf("iota[%d] = %d", i, got)
		}
	}

	// Bad launches fail with the kernel's name and no call is made.
	if err := s.Launch(axpy, Dim3{X: 1}, Dim3{X: 2048}, 0, args.Reset().Float(1).Ptr(dx).Ptr(dy).Int(0)); !errors.Is(err, ErrInvalidValue) || !strings.Contains(err.Error(), "kernel fake_axpy") {
		t.Errorf("2048-thread block = %v", err)
	}
	// A card's other limits, which the fake driver keeps so that the engine's launches are
	// held to them: grid.y and grid.z up to 65535, block.z up to 64.
	for _, c := range []struct{ grid, block Dim3 }{
		{Dim3{X: 1, Y: 65536}, Dim3{X: 1}}, {Dim3{X: 1, Y: 1, Z: 65536}, Dim3{X: 1}}, {Dim3{X: 1}, Dim3{X: 1, Y: 1, Z: 65}},
	} {
		if err := s.Launch(axpy, c.grid, c.block, 0, args.Reset().Float(1).Ptr(dx).Ptr(dy).Int(0)); !errors.Is(err, ErrInvalidValue) {
			t.Errorf("grid %+v, block %+v = %v, want CUDA_ERROR_INVALID_VALUE", c.grid, c.block, err)
		}
	}
	if err := s.Launch(axpy, Dim3{X: 1}, Dim3{X: 1}, 0, args.Reset().Int(1<<40)); err == nil || !strings.Contains(err.Error(), "does not fit an int") {
		t.Errorf("an int argument of 2^40 = %v", err)
	}
	args.Reset()
	for i := 0; i <= maxArgs; i++ {
		args.Int(i)
	}
	if err := s.Launch(axpy, Dim3{X: 1}, Dim3{X: 1}, 0, &args); err == nil {
		t.Error("too many arguments launched")
	}
}

func f32bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

// fakeAxpy returns a context of the fake driver, a stream on it and the fake module's
// fake_axpy kernel, released when the test ends.
func fakeAxpy(t *testing.T) (*Context, *Stream, *Function) {
	t.Helper()
	c := fakeContext(t)
	s, err := c.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Destroy() })
	m, err := c.LoadModule([]byte("// fake module"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Unload() })
	axpy, err := m.Function("fake_axpy")
	if err != nil {
		t.Fatal(err)
	}
	return c, s, axpy
}

// TestGraphs captures launches and copies on a stream, replays them, and checks what a
// capturing stream refuses.
func TestGraphs(t *testing.T) {
	c, s, axpy := fakeAxpy(t)
	if !c.d.Graphs() {
		t.Fatal("the fake driver has no graph calls")
	}
	const n = 8
	in, err := c.HostAlloc(4 * n)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Free()
	dx, _ := c.Alloc(4 * n)
	dy, _ := c.Alloc(4 * n)
	defer c.Free(dx)
	defer c.Free(dy)
	if err := errors.Join(s.Memset(dy, 0, 4*n), s.Synchronize()); err != nil {
		t.Fatal(err)
	}

	// A captured step: x from pinned memory, then y += 2x and y += 0.5x; nothing runs yet.
	var args Args
	if err := s.BeginCapture(); err != nil {
		t.Fatal(err)
	}
	steps := []error{
		s.CopyHtoD(dx, in.Bytes),
		s.Launch(axpy, Dim3{X: 1}, Dim3{X: 32}, 0, args.Reset().Float(2).Ptr(dx).Ptr(dy).Int(n)),
		s.Launch(axpy, Dim3{X: 1}, Dim3{X: 32}, 0, args.Reset().Float(0.5).Ptr(dx).Ptr(dy).Int(n)),
	}
	if err := errors.Join(steps...); err != nil {
		t.Fatal(err)
	}
	g, err := s.EndCapture()
	if err != nil {
		t.Fatal(err)
	}
	exec, err := g.Instantiate()
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Destroy(); err != nil {
		t.Fatal(err)
	}
	defer exec.Destroy()
	read := func() []float32 {
		b := make([]byte, 4*n)
		if err := errors.Join(s.CopyDtoH(b, dy), s.Synchronize()); err != nil {
			t.Fatal(err)
		}
		out := make([]float32, n)
		for i := range out {
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		}
		return out
	}
	if y := read(); y[3] != 0 {
		t.Fatalf("the capture ran: y = %v", y)
	}
	// Each replay reads the pinned input as it is then.
	for round, v := range []float32{1, 3} {
		copy(in.Bytes, f32bytes([]float32{v, v, v, v, v, v, v, v}))
		if err := exec.Launch(s); err != nil {
			t.Fatal(err)
		}
		want := float32(0)
		for _, u := range []float32{1, 3}[:round+1] {
			want += 2.5 * u
		}
		if y := read(); y[0] != want || y[7] != want {
			t.Errorf("replay %d: y = %v, want %v", round, y, want)
		}
	}

	// What a graph cannot hold invalidates the capture.
	pageable := make([]byte, 4*n)
	ev, err := c.NewEvent(false)
	if err != nil {
		t.Fatal(err)
	}
	defer ev.Destroy()
	for name, refused := range map[string]func() error{
		"a pageable copy":   func() error { return s.CopyHtoD(dx, pageable) },
		"a synchronisation": s.Synchronize,
		"an event record":   func() error { return ev.Record(s) },
	} {
		if err := s.BeginCapture(); err != nil {
			t.Fatal(err)
		}
		if err := s.BeginCapture(); err == nil {
			t.Errorf("%s: a second capture began", name)
		}
		if err := refused(); !errors.Is(err, ErrCaptureUnsupported) {
			t.Errorf("%s while capturing = %v", name, err)
		}
		if _, err := s.EndCapture(); !errors.Is(err, ErrCaptureInvalidated) || !strings.Contains(err.Error(), "cuStreamEndCapture") {
			t.Errorf("%s: EndCapture = %v, want the capture invalidated", name, err)
		}
	}
	if _, err := s.EndCapture(); err == nil {
		t.Error("EndCapture without a capture succeeded")
	}
}

// TestTokenCallsAllocateNothing holds the driver calls a decoded token makes (launches,
// copies, memsets, events, stream waits and synchronisations, graph launches aside) to no
// allocation each: an offloaded token makes hundreds of them.
func TestTokenCallsAllocateNothing(t *testing.T) {
	c, s, axpy := fakeAxpy(t)
	const n = 64
	dx, _ := c.Alloc(4 * n)
	dy, _ := c.Alloc(4 * n)
	defer c.Free(dx)
	defer c.Free(dy)
	host := make([]byte, 4*n)
	ev, err := c.NewEvent(false)
	if err != nil {
		t.Fatal(err)
	}
	defer ev.Destroy()
	var args Args
	for _, call := range []struct {
		name string
		fn   func() error
	}{
		{"a launch", func() error {
			return s.Launch(axpy, Dim3{X: 1}, Dim3{X: n}, 0, args.Reset().Float(1).Ptr(dx).Ptr(dy).Int(n))
		}},
		{"a copy to the device", func() error { return s.CopyHtoD(dx, host) }},
		{"a copy to the host", func() error { return s.CopyDtoH(host, dy) }},
		{"a copy on the device", func() error { return s.CopyDtoD(dy, dx, 4*n) }},
		{"a memset", func() error { return s.Memset(dx, 0, 4*n) }},
		{"an event's record", func() error { return ev.Record(s) }},
		{"a wait for an event", func() error { return s.Wait(ev) }},
		{"an event's synchronisation", func() error { return ev.Synchronize() }},
		{"an event's query", func() error { _, err := ev.Done(); return err }},
		{"a stream's synchronisation", func() error { return s.Synchronize() }},
	} {
		var err error
		if got := testing.AllocsPerRun(50, func() { err = errors.Join(err, call.fn()) }); got != 0 || err != nil {
			t.Errorf("%s: %v allocations, error %v", call.name, got, err)
		}
	}
}
