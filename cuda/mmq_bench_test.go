package cuda

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/commit-run/commit-run/quant"
)

// BenchmarkMMQ times the prefill products of a 4096 x 4096 matrix, mmq (float tiles) and mmqi
// (tensor cores, where the type has it; on compute capability 8.0 and newer also mmqi-sm75,
// the base module's m8n8k16 build beside the sm_80 module's m16n8k32) against mmv on the same
// product, for a few token counts: the figures to set mmqMinTokens by (the token count from
// which mmq is faster) and to see how far mmq is from the card's limits. Each reports
//
//	weight-GB/s  the matrix's bytes per product over the time of a product (what a kernel
//	             reading the weights once would move; mmv re-reads them every 8 tokens,
//	             mmq every 64, mostly from L2);
//	GFLOP/s      2*rows*cols*T per product over its time.
//
// Times are the device's, between events around b.N back-to-back launches. It runs only on a
// CUDA device: under the fake driver every CUDA thread is a fiber on the host, and its
// timings say nothing about a GPU.
func BenchmarkMMQ(b *testing.B) {
	k := openKernels(b)
	if !k.real {
		b.Skip("no CUDA device: the fake driver's emulator has no meaningful timings")
	}
	const rows, cols = 4096, 4096
	r := rand.New(rand.NewPCG(1, 1))
	// Q6_K: a type whose mmqi reads two blocks ahead (mmqi.cu's AHEAD), beside Q4_K's one.
	for _, typ := range []quant.Type{quant.Q4_K, quant.Q6_K, quant.Q8_0, quant.Q4_0} {
		// 64 quantized rows, repeated: quantizing 16M values would take longer than the runs.
		rb, err := typ.RowBytes(cols)
		if err != nil {
			b.Fatal(err)
		}
		data := make([]byte, rows*rb)
		for i := 0; i < 64; i++ {
			quant.QuantizeRow(typ, randF32(r, cols, 1), data[i*rb:(i+1)*rb])
		}
		for i := 64; i < rows; i++ {
			copy(data[i*rb:(i+1)*rb], data[(i%64)*rb:])
		}
		dw := k.put(b, data)
		for _, T := range []int{16, 64, 256} {
			dx, dy := k.putF32(b, randF32(r, T*cols, 1)), k.alloc(b, 4*T*rows)
			// The tensor-core kernel multiplies the activation quantized (once, not timed).
			kind, qb, _ := q8Kind(typ)
			dq, dd, ds := k.alloc(b, T*cols), k.alloc(b, 4*T*cols/qb), k.alloc(b, 4*T*cols/qb)
			var qa Args
			k.run(b, "quantize_q8_f32", Dim3{X: ceilDiv(T*cols/qb, 8)}, Dim3{X: 256}, qa.Ptr(dx).Ptr(dq).Ptr(dd).Ptr(ds).Int(cols).Int(T).Int(kind))
			for _, kernel := range []string{"mmq", "mmqi", "mmqi-sm75", "mmv"} {
				name, grid, block := mmqKernels[typ], Dim3{X: ceilDiv(rows, mmqRowsPerBlock), Y: ceilDiv(T, mmqTokensPerBlock)}, Dim3{X: mmqThreads}
				args := productArgs(dw, dx, dy, rows, cols, T)
				switch kernel {
				case "mmv":
					name, grid, block = mmvKernels[typ], Dim3{X: ceilDiv(rows, mmvRowsPerBlock), Y: ceilDiv(T, mmvTokensPerBlock)}, Dim3{X: 32, Y: mmvRowsPerBlock}
				case "mmqi", "mmqi-sm75":
					if mmqiKernels[typ] == "" || kernel == "mmqi-sm75" && k.mod.sm80 == nil {
						continue // mmqi-sm75: the base module's beside the sm_80 module's
					}
					name, block = mmqiKernels[typ], Dim3{X: mmqiThreads}
					args = Args{}
					args.Ptr(dw).Ptr(dq).Ptr(dd).Ptr(ds).Ptr(dy).Int(rows).Int(cols).Int(T)
				}
				f := k.function(b, name)
				if kernel == "mmqi-sm75" {
					var err error
					if f, err = k.mod.base.Function(name); err != nil {
						b.Fatal(err)
					}
				}
				b.Run(fmt.Sprintf("%s/T=%d/%s", typ, T, kernel), func(b *testing.B) {
					sec := timeLaunches(b, k, f, grid, block, []Args{args})
					b.ReportMetric(float64(len(data))/sec/1e9, "weight-GB/s")
					b.ReportMetric(2*float64(rows)*cols*float64(T)/sec/1e9, "GFLOP/s")
				})
			}
		}
	}
}

// timeLaunches launches kernel f b.N times after a warm-up, cycling through the argument
// lists args, and returns the device's seconds per launch.
func timeLaunches(b *testing.B, k *kernelEnv, f *Function, grid, block Dim3, args []Args) float64 {
	b.Helper()
	steps := make([][]timedLaunch, len(args))
	for i := range args {
		steps[i] = []timedLaunch{{f, grid, block, &args[i]}}
	}
	return timeSteps(b, k, steps)
}

// timedLaunch is one launch of a step that timeSteps times.
type timedLaunch struct {
	f           *Function
	grid, block Dim3
	args        *Args
}

// timeSteps runs each step (its launches in turn) once as a warm-up, then b.N steps, cycling
// through steps, and returns the device's seconds per step.
func timeSteps(b *testing.B, k *kernelEnv, steps [][]timedLaunch) float64 {
	b.Helper()
	start, err1 := k.ctx.NewEvent(true)
	end, err2 := k.ctx.NewEvent(true)
	if err := errors.Join(err1, err2); err != nil {
		b.Fatal(err)
	}
	defer start.Destroy()
	defer end.Destroy()
	run := func(step []timedLaunch) (err error) {
		for _, l := range step {
			err = errors.Join(err, k.s.Launch(l.f, l.grid, l.block, 0, l.args))
		}
		return err
	}
	var err error
	for _, step := range steps {
		err = errors.Join(err, run(step))
	}
	if err := errors.Join(err, k.s.Synchronize()); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	err = start.Record(k.s)
	for i := 0; i < b.N && err == nil; i++ {
		err = run(steps[i%len(steps)])
	}
	if err := errors.Join(err, end.Record(k.s), end.Synchronize()); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	sec, err := Elapsed(start, end)
	if err != nil {
		b.Fatal(err)
	}
	return sec / float64(b.N)
}

// productArgs are the arguments of a product kernel (mmv, mmq) over w, x and y; mmq's
// quantized activation none.
func productArgs(w, x, y DevicePtr, rows, cols, T int) Args {
	var a Args
	a.Ptr(w).Ptr(x).Ptr(y).Int(rows).Int(cols).Int(T).Ptr(0).Ptr(0).Ptr(0).Int(0)
	return a
}

// BenchmarkMMQID times a prefill pass's expert products two ways: every expert's tokens as
// its own mmqi launch (what the engine issues today, one launch per expert and product) and
// all of them in one mmqi_id launch (llama.cpp's MUL_MAT_ID shape), for Q4_K gate-sized
// matrices of two MoE shapes with a 512-token prompt's tokens spread evenly over the experts:
//
//	Qwen3-30B-A3B  128 experts of 768 x 2048, 32 tokens each (512 tokens x top-8 / 128)
//	OLMoE          64 experts of 1024 x 2048, 64 tokens each (512 x 8 / 64)
//
// Each reports us/layer (the time of one product of every expert) and weight-GB/s (the
// experts' bytes over it). It runs only on a CUDA device (see BenchmarkMMQ).
func BenchmarkMMQID(b *testing.B) {
	k := openKernels(b)
	if !k.real {
		b.Skip("no CUDA device: the fake driver's emulator has no meaningful timings")
	}
	typ := quant.Q4_K
	r := rand.New(rand.NewPCG(2, 2))
	for _, s := range []struct {
		name                    string
		experts, rows, cols, nt int
	}{{"qwen3moe", 128, 768, 2048, 32}, {"olmoe", 64, 1024, 2048, 64}} {
		rb, err := typ.RowBytes(s.cols)
		if err != nil {
			b.Fatal(err)
		}
		// 64 quantized rows, repeated, then a copy per expert, so that each reads its own.
		data := make([]byte, s.rows*rb)
		for i := 0; i < 64; i++ {
			quant.QuantizeRow(typ, randF32(r, s.cols, 1), data[i*rb:(i+1)*rb])
		}
		for i := 64; i < s.rows; i++ {
			copy(data[i*rb:(i+1)*rb], data[(i%64)*rb:])
		}
		N := s.experts * s.nt
		ws, tab, off := make([]DevicePtr, s.experts), make([]uint64, s.experts), make([]int32, s.experts+1)
		for e := range ws {
			ws[e] = k.put(b, data)
			tab[e], off[e+1] = uint64(ws[e]), off[e]+int32(s.nt)
		}
		dx, dy := k.putF32(b, randF32(r, N*s.cols, 1)), k.alloc(b, 4*N*s.rows)
		kind, qb, _ := q8Kind(typ)
		dq, dd := k.alloc(b, N*s.cols), k.alloc(b, 4*N*s.cols/qb)
		var qa Args
		k.run(b, "quantize_q8_f32", Dim3{X: ceilDiv(N*s.cols/qb, 8)}, Dim3{X: 256}, qa.Ptr(dx).Ptr(dq).Ptr(dd).Ptr(0).Int(s.cols).Int(N).Int(kind))
		block, gx := Dim3{X: mmqiThreads}, ceilDiv(s.rows, mmqRowsPerBlock)
		per := make([]Args, s.experts)
		for e := range per {
			t0 := int(off[e])
			per[e].Ptr(ws[e]).Ptr(dq.Add(int64(t0 * s.cols))).Ptr(dd.Add(int64(4 * t0 * s.cols / qb))).Ptr(0).Ptr(dy.Add(int64(4 * t0 * s.rows))).
				Int(s.rows).Int(s.cols).Int(s.nt)
		}
		var grouped Args
		grouped.Ptr(k.put(b, u64bytes(tab))).Int(1).Ptr(k.put(b, i32bytes(off))).Ptr(0).Ptr(0).Ptr(dq).Ptr(dd).Ptr(0).Ptr(dy).Int(s.rows).Int(s.cols)
		bytes := float64(s.experts * len(data))
		report := func(b *testing.B, sec float64) {
			b.ReportMetric(sec*1e6, "us/layer")
			b.ReportMetric(bytes/sec/1e9, "weight-GB/s")
		}
		b.Run(s.name+"/per-expert", func(b *testing.B) {
			// One launch per expert: a layer's product is experts launches.
			report(b, float64(s.experts)*timeLaunches(b, k, k.function(b, mmqiKernels[typ]), Dim3{X: gx, Y: 1}, block, per))
		})
		b.Run(s.name+"/grouped", func(b *testing.B) {
			report(b, timeLaunches(b, k, k.function(b, "mmqi_id_q4_K"), Dim3{X: gx, Y: 1, Z: s.experts}, block, []Args{grouped}))
		})
	}
}
