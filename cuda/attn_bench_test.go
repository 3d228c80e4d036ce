package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// BenchmarkAttnDecode times a decoded token's attention (one token over an F16 cache, as the
// engine's decode steps run it) at growing contexts, on OLMoE's heads (16 of 128 values, each
// its own KV head) and Qwen3-30B-A3B's (32 query heads on 4 KV heads), two ways:
//
//	one       attn_f16kv: a block a query head, so on a card of a hundred SMs or more most of
//	          them wait, and every warp walks its share of the positions one after another;
//	split=S   attn_split_scores_f16kv then attn_split_pv_f16kv, S blocks a head as the engine
//	          sizes them (attnSplits) for a cache of that many positions.
//
// Each reports
//
//	us/token  the device's time for the token's launches;
//	kv-GB/s   the keys and values read (each position's, each KV head's once) over that time.
//
// Times are the device's, between events around b.N tokens. It runs only on a CUDA device.
func BenchmarkAttnDecode(b *testing.B) {
	k := openKernels(b)
	if !k.real {
		b.Skip("no CUDA device: the fake driver's emulator has no meaningful timings")
	}
	r := rand.New(rand.NewPCG(3, 3))
	for _, s := range []struct {
		name               string
		heads, kvHeads, dk int
	}{{"olmoe", 16, 16, 128}, {"qwen3moe", 32, 4, 128}} {
		for _, n := range []int{512, 2048, 8192} {
			kvd := s.kvHeads * s.dk
			cache := benchHalves(r, n*kvd)
			dk, dv := k.put(b, cache), k.put(b, cache)
			dq, dout := k.putF32(b, randF32(r, s.heads*s.dk, 1)), k.alloc(b, 4*s.heads*s.dk)
			scale := float32(1 / math.Sqrt(float64(s.dk)))
			var one Args
			one.Ptr(dq).Ptr(dk).Ptr(dv).Ptr(dout).Int(1).Int(s.heads).Int(s.kvHeads).Int(s.dk).Int(s.dk).Int(kvd).Int(kvd).Int(s.dk).Int(s.dk).
				Ptr(0).Int(n - 1).Float(scale).Int(0).Ptr(0).Int(0)
			splits, sstride := attnSplits(s.heads, n, k.info.SMs), n+16
			sc, st := k.alloc(b, 4*s.heads*sstride), k.alloc(b, 4*s.heads*(splits+2))
			part, cnt := k.alloc(b, 4*s.heads*splits*s.dk), k.put(b, make([]byte, 4*s.heads))
			var scores, pv Args
			scores.Ptr(dq).Ptr(dk).Ptr(sc).Ptr(st).Ptr(cnt).Int(1).Int(s.heads).Int(s.kvHeads).Int(s.dk).Int(kvd).Int(s.dk).
				Ptr(0).Int(n - 1).Float(scale).Int(0).Ptr(0).Int(0).Int(sstride).Int(splits)
			pv.Ptr(sc).Ptr(st).Ptr(dv).Ptr(part).Ptr(cnt).Ptr(dout).Int(1).Int(s.heads).Int(s.kvHeads).Int(s.dk).Int(kvd).Int(s.dk).
				Ptr(0).Int(n - 1).Int(0).Int(0).Int(sstride).Int(splits)
			grid := Dim3{X: s.heads, Y: splits, Z: 1}
			for _, v := range []struct {
				name string
				step []timedLaunch
			}{
				{"one", []timedLaunch{{k.function(b, "attn_f16kv"), Dim3{X: s.heads, Y: 1}, Dim3{X: 256}, &one}}},
				{fmt.Sprintf("split=%d", splits), []timedLaunch{
					{k.function(b, "attn_split_scores_f16kv"), grid, Dim3{X: 256}, &scores},
					{k.function(b, "attn_split_pv_f16kv"), grid, Dim3{X: 256}, &pv},
				}},
			} {
				b.Run(fmt.Sprintf("%s/n=%d/%s", s.name, n, v.name), func(b *testing.B) {
					sec := timeSteps(b, k, [][]timedLaunch{v.step})
					b.ReportMetric(sec*1e6, "us/token")
					b.ReportMetric(float64(2*len(cache))/sec/1e9, "kv-GB/s")
				})
			}
		}
	}
}

// BenchmarkAttnPrefill times a prompt's attention (n tokens from position 0 over an F16 cache,
// as a first pass runs it) on the same heads as BenchmarkAttnDecode, on Qwen3.6's
// full-attention layers (16 heads of 256 on 2 KV heads) and on DeepSeek-V2-Lite's 16 MLA heads
// in both file layouts (legacy: 16 KV heads of 192 keys and 128 values; absorbed: the latent
// cache of 576, its first 512 the values), two ways:
//
//	f16kv  attn_f16kv: a block a (query head, token), each warp scoring one position at a time
//	       with float32 products and warp sums;
//	flash  the flash kernel of the heads (flashLaunch): a block 64 tokens of a head (32 for
//	       heads of 256; 16 rows (token, head) for the latent cache), the scores and the
//	       weighted values on the tensor cores (m16n8k16 on sm_80 and newer), each tile of keys
//	       and values read once for the block's rows.
//
// Each reports
//
//	ms/pass     the device's time for the launch;
//	TFLOP/s     the products' operations (2 dk for a score, 2 dv for a weighted value, over the
//	            n(n+1)/2 visible pairs of each head) over that time.
//
// It runs only on a CUDA device.
func BenchmarkAttnPrefill(b *testing.B) {
	k := openKernels(b)
	if !k.real {
		b.Skip("no CUDA device: the fake driver's emulator has no meaningful timings")
	}
	r := rand.New(rand.NewPCG(5, 5))
	for _, s := range []struct {
		name                   string
		heads, kvHeads, dk, dv int
		latent                 bool
	}{
		{"olmoe", 16, 16, 128, 128, false}, {"qwen3moe", 32, 4, 128, 128, false}, {"qwen36", 16, 2, 256, 256, false},
		{"dsv2lite-legacy", 16, 16, 192, 128, false}, {"dsv2lite-mla", 16, 1, 576, 512, true},
	} {
		for _, n := range []int{512, 2048, 4096} {
			kstride, vstride, khs, vhs := s.kvHeads*s.dk, s.kvHeads*s.dv, s.dk, s.dv
			if s.latent {
				kstride, vstride, khs, vhs = s.dk, s.dk, 0, 0
			}
			dk := k.put(b, benchHalves(r, n*kstride))
			dv := dk
			if !s.latent {
				dv = k.put(b, benchHalves(r, n*vstride))
			}
			dq, dout := k.putF32(b, randF32(r, n*s.heads*s.dk, 1)), k.alloc(b, 4*n*s.heads*s.dv)
			var args Args
			args.Ptr(dq).Ptr(dk).Ptr(dv).Ptr(dout).Int(n).Int(s.heads).Int(s.kvHeads).Int(s.dk).Int(s.dv).Int(kstride).Int(vstride).Int(khs).Int(vhs).
				Ptr(0).Int(0).Float(float32(1 / math.Sqrt(float64(s.dk)))).Int(0).Ptr(0).Int(0)
			flops := 2 * float64(s.heads) * float64(s.dk+s.dv) * float64(n) * float64(n+1) / 2
			flash, grid := flashLaunch(s.dk, s.dv, s.latent, n, s.heads)
			for _, v := range []struct {
				name string
				l    timedLaunch
			}{
				{"f16kv", timedLaunch{k.function(b, "attn_f16kv"), Dim3{X: s.heads, Y: n}, Dim3{X: 256}, &args}},
				{"flash", timedLaunch{k.function(b, flash), grid, Dim3{X: 128}, &args}},
			} {
				b.Run(fmt.Sprintf("%s/n=%d/%s", s.name, n, v.name), func(b *testing.B) {
					sec := timeSteps(b, k, [][]timedLaunch{{v.l}})
					b.ReportMetric(sec*1e3, "ms/pass")
					b.ReportMetric(flops/sec/1e12, "TFLOP/s")
				})
			}
		}
	}
}

// benchHalves returns n random halves of modest magnitude, no NaN or Inf, as bytes: a cache's
// keys or values for the attention benchmarks.
func benchHalves(r *rand.Rand, n int) []byte {
	b := make([]byte, 2*n)
	for i := range b {
		b[i] = byte(r.Uint32() & 0x3b)
	}
	return b
}
