package cuda

import (
	"math/rand/v2"
	"testing"
)

// TestGPUParamRing gathers with index lists from the host far beyond the parameter ring's
// megabyte, its halves taken in turn: every gather reads its own indices.
func TestGPUParamRing(t *testing.T) {
	g := openFakeGPU(t, GPUOptions{})
	r := rand.New(rand.NewPCG(5, 6))
	const rows, n, rounds = 64, 300, 2000 // 1200 bytes a round, 2.4 MB in all
	src := randF32(r, rows, 1)
	dsrc, dst := deviceFloats(t, g, rows, src), deviceFloats(t, g, rounds*n, nil)
	want := make([]float32, rounds*n)
	idx := make([]int32, n)
	for i := 0; i < rounds; i++ {
		for j := range idx {
			idx[j] = int32(r.IntN(rows))
			want[i*n+j] = src[idx[j]]
		}
		g.Gather(dst[i*n:(i+1)*n], dsrc, idx, 1)
	}
	if err := g.Err(); err != nil {
		t.Fatal(err)
	}
	checkBits(t, "gathered", hostFloats(g, dst), want)
	if !g.ringUsed[0] || !g.ringUsed[1] {
		t.Errorf("the ring's halves used: %v", g.ringUsed)
	}
}
