package sim_test

import (
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/quant"
	"github.com/commit-run/commit-run/sim"
)

// countingKernels stands in for the CPU device: it counts the products it is asked for.
type countingKernels struct{ matMuls, ids int }

func (k *countingKernels) MatMul(quant.Matrix, []float32, int, []float32)   { k.matMuls++ }
func (k *countingKernels) MatMulID(quant.Matrix, []float32, int, []float32) { k.ids++ }
func (k *countingKernels) Parallel(n int, fn func(int)) {
	for i := 0; i < n; i++ {
		fn(i)
	}
}

// roundProfile has numbers that make hand arithmetic easy: 1 GB/s everywhere, 1 µs fixed costs.
func roundProfile() *sim.Profile {
	return &sim.Profile{Name: "round", MemoryBytes: 1 << 30, MemoryBandwidth: 1e9, PeakFLOPS: 1e12,
		PCIeBandwidth: 2e9, PCIeEffective: 1e9, CopyLatency: 1e-6, LaunchOverhead: 1e-6, Sources: []string{"test"}}
}

func newRoundDevice(t *testing.T, k device.Kernels) *sim.Device {
	t.Helper()
	d, err := sim.NewDevice(roundProfile(), sim.DeviceOptions{Numerics: k, HostRates: device.HostRates{Bandwidth: 2e9, FLOPS: 1e11, Overhead: 5e-6}})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-12 }

// One copy overlapped with one kernel, then a kernel that needs the copy: it stalls until the
// copy lands, and the host's sync ends with it.
func TestDeviceCopyOverlapsKernel(t *testing.T) {
	d := newRoundDevice(t, &countingKernels{})
	src := make([]byte, 999_000)
	d.CopyIn(make([]byte, len(src)), src) // copy stream [0, 1 ms]
	d.Charge("k1", 499_000, 0)            // compute [0, 0.5 ms]
	d.Compute().Wait(d.Copy().Record())
	d.Charge("k2", 999_000, 0) // compute [1 ms, 2 ms]
	d.Sync(d.Compute().Record())
	st := d.Stats()
	if !near(st.Now, 2e-3) || !near(st.ComputeStalled, 0.5e-3) || !near(st.CopyBusy, 1e-3) || !near(st.ComputeBusy, 1.5e-3) || !near(st.HostWaited, 2e-3) {
		t.Errorf("stats %+v: want now 2 ms, compute stalled 0.5 ms, copy 1 ms, compute 1.5 ms, host waited 2 ms", st)
	}
	var kinds []string
	for _, s := range d.Spans() {
		kinds = append(kinds, s.Stream+"/"+s.Kind)
	}
	if got := strings.Join(kinds, " "); got != "copy/copy compute/k1 compute/stall compute/k2 host/wait" {
		t.Errorf("spans %s", got)
	}
}

// A kernel that does not wait for the copy runs at once: events order streams only when
// asked to, as on CUDA.
func TestDeviceNoEventNoStall(t *testing.T) {
	d := newRoundDevice(t, &countingKernels{})
	d.CopyIn(make([]byte, 999_000), make([]byte, 999_000))
	d.Charge("k", 999_000, 0)
	d.Sync(d.Compute().Record())
	if st := d.Stats(); !near(st.Now, 1e-3) || st.ComputeStalled != 0 {
		t.Errorf("stats %+v: want now 1 ms and no stall", st)
	}
}

// A matrix product computes (through the numerics) and is priced by the roofline of the
// weights as stored plus float32 activations in and out.
func TestDeviceMatMulCost(t *testing.T) {
	k := &countingKernels{}
	d := newRoundDevice(t, k)
	w := quant.Matrix{Type: quant.F32, Rows: 250, Cols: 1000, Data: make([]byte, 250*1000*4)}
	d.MatMul(w, make([]float32, 1000), 1, make([]float32, 250))
	d.MatMulID(w, make([]float32, 4000), 4, make([]float32, 1000))
	d.Sync(d.Compute().Record())
	// bytes 1e6 + 4*T*1250; flops 2*T*250e3 stay far under the memory time.
	want := (1e6+5000)/1e9 + 1e-6 + (1e6+20000)/1e9 + 1e-6
	if st := d.Stats(); k.matMuls != 1 || k.ids != 1 || !near(st.ComputeBusy, want) {
		t.Errorf("numerics %d+%d calls, compute %v s, want 1+1 and %v s", k.matMuls, k.ids, st.ComputeBusy, want)
	}
	// A product with enough rows is bound by flops instead.
	d2 := newRoundDevice(t, k)
	d2.MatMul(w, make([]float32, 1000*10000), 10000, make([]float32, 250*10000))
	if got, want := d2.Stats().ComputeBusy, 2*1e4*250e3/1e12+1e-6; got < want {
		t.Errorf("10000 rows: %v s, want at least the flops time %v s", got, want)
	}
}

// The host's kernels run on their own stream at the host bandwidth; the device waits for
// their result only through an event, and the planner predicts both finishing times.
func TestDeviceHostKernels(t *testing.T) {
	d := newRoundDevice(t, &countingKernels{})
	w := quant.Matrix{Type: quant.F32, Rows: 1, Cols: 500_000, Data: make([]byte, 2_000_000)}
	if got, want := d.HostDone(device.HostWork{Bytes: 2_000_000, Kernels: 1}), 2e6/2e9+5e-6; !near(got, want) {
		t.Errorf("HostDone %v, want %v", got, want)
	}
	if got, want := d.CopyDone(2_000_000), 2e6/1e9+1e-6; !near(got, want) {
		t.Errorf("CopyDone %v, want %v", got, want)
	}
	h := d.Host()
	h.MatMul(w, make([]float32, 500_000), 1, make([]float32, 1)) // cpu [0, 1.005 ms]
	d.Charge("k", 99_000, 0)                                     // compute [0, 0.1 ms]
	d.Compute().Wait(h.Record())
	d.Charge("combine", 0, 0) // compute [1.005 ms, 1.006 ms]
	d.Sync(d.Compute().Record())
	if st := d.Stats(); !near(st.Now, 1.006e-3) || !near(st.HostCompute, 1.005e-3) || !near(st.ComputeStalled, 0.905e-3) {
		t.Errorf("stats %+v: want now 1.006 ms, host 1.005 ms, stalled 0.905 ms", st)
	}
}

// A host kernel of several tokens reads its weights once and adds the arithmetic of every
// token after the first, as the planner prices it.
func TestDeviceHostBatch(t *testing.T) {
	d := newRoundDevice(t, &countingKernels{})
	w := quant.Matrix{Type: quant.F32, Rows: 2, Cols: 250_000, Data: make([]byte, 2_000_000)}
	work := device.HostWork{}.Plus(w, 4)
	if work.Bytes != 2_000_000 || work.FLOPs != 3*2*500_000 || work.Kernels != 1 {
		t.Fatalf("work %+v: want 2 MB, 3 further tokens of 1 Mflop, 1 kernel", work)
	}
	want := 2e6/2e9 + 3e6/1e11 + 5e-6
	if got := d.HostDone(work); !near(got, want) {
		t.Errorf("HostDone %v, want %v", got, want)
	}
	d.Host().MatMul(w, make([]float32, 4*250_000), 4, make([]float32, 4*2))
	if st := d.Stats(); !near(st.HostCompute, want) {
		t.Errorf("a 4-token host kernel took %v s, want %v s", st.HostCompute, want)
	}
}

// Several host products in one parallel region (device.Batcher) cost their weights' reads and
// one kernel's fixed cost, as the CPU computes a layer's experts, and each is computed.
func TestDeviceHostBatcher(t *testing.T) {
	k := &countingKernels{}
	d := newRoundDevice(t, k)
	w := quant.Matrix{Type: quant.F32, Rows: 1, Cols: 250_000, Data: make([]byte, 1_000_000)}
	x := make([]float32, 250_000)
	ps := []device.BatchProduct{{W: w, X: x, T: 1, Out: make([]float32, 1)}, {W: w, X: x, T: 1, Out: make([]float32, 1)},
		{W: w, X: x, T: 1, Out: make([]float32, 1)}}
	d.Host().(device.Batcher).MatMulIDs(ps)
	if want := 3e6/2e9 + 5e-6; !near(d.Stats().HostCompute, want) || k.ids != 3 {
		t.Errorf("3 products in one region: %v s and %d computed, want %v s and 3", d.Stats().HostCompute, k.ids, want)
	}
}

func TestDeviceLabels(t *testing.T) {
	d := newRoundDevice(t, &countingKernels{})
	d.Label("expert", "L1 E3")
	d.Charge("swiglu", 10, 0)
	d.CopyIn(make([]byte, 8), make([]byte, 8))
	sp := d.Spans()
	if len(sp) != 2 || sp[0].Kind != "expert" || sp[0].Label != "L1 E3" || sp[1].Kind != "copy" || sp[1].Label != "L1 E3" {
		t.Errorf("spans %+v: want the kernel drawn as expert L1 E3 and the copy as a copy", sp)
	}
}

func TestNewDeviceBadInput(t *testing.T) {
	k := &countingKernels{}
	big, _ := device.NewMemory(2 << 30)
	cases := []struct {
		name string
		p    *sim.Profile
		o    sim.DeviceOptions
		want string
	}{
		{"no numerics", roundProfile(), sim.DeviceOptions{}, "numerics"},
		{"budget over the card", roundProfile(), sim.DeviceOptions{Numerics: k, Memory: big}, "exceeds"},
		{"negative host rate", roundProfile(), sim.DeviceOptions{Numerics: k, HostRates: device.HostRates{Bandwidth: -1}}, "host bandwidth"},
		{"infinite host flops", roundProfile(), sim.DeviceOptions{Numerics: k, HostRates: device.HostRates{FLOPS: math.Inf(1)}}, "host flops"},
		{"bad profile", &sim.Profile{Name: "x"}, sim.DeviceOptions{Numerics: k}, "memory_bytes"},
	}
	for _, c := range cases {
		if _, err := sim.NewDevice(c.p, c.o); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error mentioning %q", c.name, err, c.want)
		}
	}
}

// A collective on the link starts when every member is ready (the start its caller passes,
// never before the device itself is ready), and the compute stream's next kernel waits for it.
func TestDeviceTransfer(t *testing.T) {
	d := newRoundDevice(t, &countingKernels{})
	d.Charge("k", 1000, 0) // 1 µs launch + 1 µs of bytes
	if r := d.Ready(); !near(r, 2e-6) {
		t.Fatalf("ready at %v, want 2 µs", r)
	}
	d.Label("link", "dispatch L0")
	d.Transfer(5e-6, 9e-6) // another rank was ready at 5 µs
	d.Charge("k", 1000, 0)
	if r := d.Ready(); !near(r, 11e-6) {
		t.Errorf("kernel after the transfer ends at %v, want 11 µs", r)
	}
	var link []sim.Span
	for _, sp := range d.Spans() {
		if sp.Stream == "link" && sp.Kind == "link" {
			link = append(link, sp)
		}
	}
	if len(link) != 1 || !near(link[0].Start, 5e-6) || !near(link[0].End, 9e-6) || link[0].Label != "dispatch L0" {
		t.Errorf("link spans %+v, want one dispatch L0 from 5 to 9 µs", link)
	}
}

// A timing-only device charges the same timeline as one that computes, and neither computes
// nor copies: its outputs and slots keep what they held.
func TestDeviceTimingOnly(t *testing.T) {
	run := func(d *sim.Device) (out []float32, dst []byte) {
		w := quant.Matrix{Type: quant.F32, Rows: 2, Cols: 4, Data: make([]byte, 2*4*4)}
		out, dst = []float32{7, 7}, []byte{9, 9, 9}
		d.CopyIn(dst, []byte{1, 2, 3})
		d.Compute().Wait(d.Copy().Record())
		d.MatMul(w, make([]float32, 4), 1, out)
		d.MatMulID(w, make([]float32, 4), 1, out)
		h := d.Host()
		h.MatMulID(w, make([]float32, 4), 1, out)
		d.Compute().Wait(h.Record())
		n := 0
		d.Parallel(5, func(int) { n++ })
		if n != 5 {
			t.Errorf("Parallel ran %d of 5 calls", n)
		}
		d.Sync(d.Compute().Record())
		return out, dst
	}
	k := &countingKernels{}
	full := newRoundDevice(t, k)
	run(full)
	d, err := sim.NewDevice(roundProfile(), sim.DeviceOptions{TimingOnly: true, HostRates: device.HostRates{Bandwidth: 2e9, FLOPS: 1e11, Overhead: 5e-6}})
	if err != nil {
		t.Fatal(err)
	}
	out, dst := run(d)
	if out[0] != 7 || out[1] != 7 || string(dst) != "\t\t\t" {
		t.Errorf("timing only computed or copied: out %v, dst %v", out, dst)
	}
	if got, want := d.Spans(), full.Spans(); !slices.Equal(got, want) {
		t.Errorf("timing-only spans\n%v\nwant those of the computing device\n%v", got, want)
	}
}
