package cuda

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// BenchmarkDeltaNet times each kernel of a gated DeltaNet layer of Qwen3.6-35B-A3B's shape
// (16 key and 32 value heads of 128, a convolution of 4 taps) on a decoded token and on a
// 512-token prompt, as GPU.GatedDeltaNet launches them. Each reports
//
//	tokens/s    the pass's tokens over the kernel's time;
//	state-GB/s  (the recurrence) the state's bytes read and written once, over its time: what
//	            bounds a decoded token.
//
// Times are the device's, between events around b.N back-to-back launches, each moving the
// state on. It runs only on a CUDA device (see BenchmarkMMQ).
func BenchmarkDeltaNet(b *testing.B) {
	k := openKernels(b)
	if !k.real {
		b.Skip("no CUDA device: the fake driver's emulator has no meaningful timings")
	}
	const kheads, vheads, n, taps = 16, 32, 128, 4
	ch, vd := (2*kheads+vheads)*n, vheads*n
	r := rand.New(rand.NewPCG(1, 1))
	a := randF32(r, vheads, 1)
	for h := range a {
		a[h] = -0.1 - a[h]*a[h] // a decay, as -e^A_log
	}
	dw, ddt, da, dnorm := k.putF32(b, randF32(r, taps*ch, 0.5)), k.putF32(b, randF32(r, vheads, 1)), k.putF32(b, a), k.putF32(b, randF32(r, n, 1))
	dcst, ds := k.alloc(b, 4*(taps-1)*ch), k.alloc(b, 4*vheads*n*n)
	for _, T := range []int{1, 512} {
		dqkv, dz := k.putF32(b, randF32(r, T*ch, 1)), k.putF32(b, randF32(r, T*vd, 1))
		dbeta, dalpha := k.putF32(b, randF32(r, T*vheads, 2)), k.putF32(b, randF32(r, T*vheads, 2))
		dconv, dout := k.alloc(b, 4*T*ch), k.alloc(b, 4*T*vd)
		var conv, prep, rec, norm Args
		conv.Ptr(dqkv).Ptr(dconv).Ptr(dcst).Ptr(0).Ptr(dw).Int(ch).Int(taps).Int(T)
		// prep works in place: timed over and over, its inputs become its outputs' images,
		// which changes none of its work.
		prep.Ptr(dconv).Ptr(dbeta).Ptr(dalpha).Ptr(ddt).Ptr(da).Int(kheads).Int(vheads).Int(n).Int(T).Float(1e-6)
		rec.Ptr(dconv).Ptr(dbeta).Ptr(dalpha).Ptr(ds).Ptr(0).Ptr(dout).Int(kheads).Int(vheads).Int(n).Int(T)
		norm.Ptr(dout).Ptr(dz).Ptr(dnorm).Ptr(0).Int(n).Int(T * vheads).Float(1e-6)
		for _, l := range []struct {
			name        string
			grid, block Dim3
			args        Args
		}{
			{"deltanet_conv_f32", Dim3{X: ceilDiv(ch, 256)}, Dim3{X: 256}, conv},
			{"deltanet_prep_f32", Dim3{X: T, Y: 2 * kheads}, Dim3{X: 128}, prep},
			{"deltanet_rec_f32", Dim3{X: vheads, Y: n / deltaNetRowsPerBlock}, Dim3{X: 128}, rec},
			{"deltanet_norm_f32", Dim3{X: T * vheads}, Dim3{X: 128}, norm},
		} {
			b.Run(fmt.Sprintf("T=%d/%s", T, l.name), func(b *testing.B) {
				sec := timeLaunches(b, k, k.function(b, l.name), l.grid, l.block, []Args{l.args})
				b.ReportMetric(float64(T)/sec, "tokens/s")
				if l.name == "deltanet_rec_f32" {
					b.ReportMetric(2*4*vheads*n*n/sec/1e9, "state-GB/s")
				}
			})
		}
	}
}
