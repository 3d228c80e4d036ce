package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// BenchmarkAttnDecode times a decoded token's attention (attn_f16kv, one token over an F16
// cache, as the engine's decode steps run it) at growing contexts, on OLMoE's heads (16 of 128
// values, each its own KV head) and Qwen3-30B-A3B's (32 query heads on 4 KV heads): its launch
// is a block a query head, so on a card of a hundred SMs or more most of them wait, and every
// warp walks its share of the positions one after another. Whether that is where a decoded
// token's time goes at a long context is what it measures.
//
//	us/token  the device's time for one launch;
//	kv-GB/s   the keys and values read (each position's, each KV head's once) over that time.
//
// Times are the device's, between events around b.N launches. It runs only on a CUDA device.
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
			cache := make([]byte, 2*n*kvd)
			for i := range cache {
				cache[i] = byte(r.Uint32() & 0x3b) // halves of modest magnitude, no NaN or Inf
			}
			dk, dv := k.put(b, cache), k.put(b, cache)
			dq, dout := k.putF32(b, randF32(r, s.heads*s.dk, 1)), k.alloc(b, 4*s.heads*s.dk)
			b.Run(fmt.Sprintf("%s/n=%d", s.name, n), func(b *testing.B) {
				var a Args
				a.Ptr(dq).Ptr(dk).Ptr(dv).Ptr(dout).Int(1).Int(s.heads).Int(s.kvHeads).Int(s.dk).Int(s.dk).Int(kvd).Int(kvd).Int(s.dk).Int(s.dk).
					Ptr(0).Int(n - 1).Float(float32(1 / math.Sqrt(float64(s.dk)))).Int(0).Ptr(0).Int(0)
				sec := timeLaunches(b, k, k.function(b, "attn_f16kv"), Dim3{X: s.heads, Y: 1}, Dim3{X: 256}, []Args{a})
				b.ReportMetric(sec*1e6, "us/token")
				b.ReportMetric(float64(2*len(cache))/sec/1e9, "kv-GB/s")
			})
		}
	}
}
