package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/commit-run/commit-run/cpu"
	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/models"
)

// deltaNetCases run a gated DeltaNet layer's four kernels, as cuda.GPU.GatedDeltaNet launches
// them, against HostOps.GatedDeltaNet, the CPU reference (llama.cpp's gated_delta_net), over
// passes of several tokens and single tokens carrying the state from one to the next, with and
// without a snapshot: the outputs, the recurrent states and their snapshots within float32
// rounding (the dot products add in other orders), the convolution's states and snapshots to
// the bit. Qwen3.5's shape (2 key heads under 4 value heads).
func deltaNetCases() []kernelCase {
	var cs []kernelCase
	// Every case runs all four; each kernel is named by at least one, and the head sizes
	// take a state row of 1, 2, 3, 4 and 8 values a lane.
	for _, c := range []struct {
		kernel string
		n      int
	}{{"deltanet_conv_f32", 32}, {"deltanet_rec_f32", 128}, {"deltanet_rec_f32", 256}, {"deltanet_prep_f32", 96}, {"deltanet_norm_f32", 64}} {
		cs = append(cs, kernelCase{c.kernel, fmt.Sprintf("kheads=2,vheads=4,head=%d,taps=4", c.n),
			func(t *testing.T, k *kernelEnv, r *rand.Rand) { checkDeltaNet(t, k, c.n, r) }})
	}
	return cs
}

func checkDeltaNet(t *testing.T, k *kernelEnv, n int, r *rand.Rand) {
	host := models.HostOps{K: cpu.New(2)}
	l := device.DeltaNetLayer{KHeads: 2, VHeads: 4, HeadDim: n, ConvK: 4, Eps: 1e-6}
	ch, hv, vd := l.Channels(), l.VHeads, l.VHeads*n
	l.Conv, l.DtBias, l.A, l.NormW = randF32(r, l.ConvK*ch, 0.5), randF32(r, hv, 1), randF32(r, hv, 1), randUniform(r, n, 0.5, 1.5)
	for h := range l.A {
		l.A[h] = -float32(math.Abs(float64(l.A[h]))) - 0.1 // -e^A_log < 0: a decay
	}
	dw, ddt, da, dnorm := k.putF32(t, l.Conv), k.putF32(t, l.DtBias), k.putF32(t, l.A), k.putF32(t, l.NormW)
	hst := device.DeltaNetState{Conv: make([]float32, (l.ConvK-1)*ch), S: make([]float32, hv*n*n)}
	dcst, ds := k.putF32(t, hst.Conv), k.putF32(t, hst.S)
	var args Args
	for pass, T := range []int{5, 1, 1, 3, 1} {
		qkv, z := randF32(r, T*ch, 1), randF32(r, T*vd, 1)
		beta, alpha := randF32(r, T*hv, 2), randF32(r, T*hv, 2)
		var hsnap *device.DeltaNetState
		var dcsnap, dssnap DevicePtr
		if T > 1 {
			hsnap = &device.DeltaNetState{Conv: make([]float32, len(hst.Conv)), S: make([]float32, len(hst.S))}
			dcsnap, dssnap = k.alloc(t, 4*len(hst.Conv)), k.alloc(t, 4*len(hst.S))
		}
		dqkv, dz, dbeta, dalpha := k.putF32(t, qkv), k.putF32(t, z), k.putF32(t, beta), k.putF32(t, alpha)
		dconv, dout := k.alloc(t, 4*T*ch), k.alloc(t, 4*T*vd)
		k.run(t, "deltanet_conv_f32", Dim3{X: ceilDiv(ch, 256)}, Dim3{X: 256},
			args.Reset().Ptr(dqkv).Ptr(dconv).Ptr(dcst).Ptr(dcsnap).Ptr(dw).Int(ch).Int(l.ConvK).Int(T))
		k.run(t, "deltanet_prep_f32", Dim3{X: T, Y: 2 * l.KHeads}, Dim3{X: 128},
			args.Reset().Ptr(dconv).Ptr(dbeta).Ptr(dalpha).Ptr(ddt).Ptr(da).Int(l.KHeads).Int(hv).Int(n).Int(T).Float(l.Eps))
		k.run(t, "deltanet_rec_f32", Dim3{X: hv, Y: n / deltaNetRowsPerBlock}, Dim3{X: 128},
			args.Reset().Ptr(dconv).Ptr(dbeta).Ptr(dalpha).Ptr(ds).Ptr(dssnap).Ptr(dout).Int(l.KHeads).Int(hv).Int(n).Int(T))
		k.run(t, "deltanet_norm_f32", Dim3{X: T * hv}, Dim3{X: 128},
			args.Reset().Ptr(dout).Ptr(dz).Ptr(dnorm).Ptr(0).Int(n).Int(T*hv).Float(l.Eps))
		want := make([]float32, T*vd)
		host.GatedDeltaNet(&l, &hst, hsnap, slices.Clone(qkv), slices.Clone(z), slices.Clone(beta), slices.Clone(alpha), T,
			make([]float32, T*ch), want)
		what := fmt.Sprintf("pass %d of %d tokens", pass, T)
		near(t, what+": output", k.getF32(t, dout, T*vd), want, 2e-5)
		checkBits(t, what+": convolution state", k.getF32(t, dcst, len(hst.Conv)), hst.Conv)
		near(t, what+": recurrent state", k.getF32(t, ds, len(hst.S)), hst.S, 2e-5)
		if hsnap != nil {
			checkBits(t, what+": convolution snapshot", k.getF32(t, dcsnap, len(hst.Conv)), hsnap.Conv)
			near(t, what+": recurrent snapshot", k.getF32(t, dssnap, len(hst.S)), hsnap.S, 2e-5)
		}
	}
}

// near requires |got - want| <= tol * (1 + |want|) for every value.
func near(t *testing.T, what string, got, want []float32, tol float64) {
	t.Helper()
	bad := 0
	for i := range want {
		if d := math.Abs(float64(got[i] - want[i])); !(d <= tol*(1+math.Abs(float64(want[i])))) {
			if bad++; bad <= 3 {
				t.Errorf("%s[%d] = %v, want %v", what, i, got[i], want[i])
			}
		}
	}
	if bad > 3 {
		t.Errorf("%s: %d of %d values off", what, bad, len(want))
	}
}
