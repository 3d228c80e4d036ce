package synth

import (
	"hash/fnv"
	"math/rand/v2"
)

// rng is the random stream of one tensor. It is seeded from the spec's seed and the tensor's
// name, so a tensor's values do not depend on the order in which tensors are generated (the
// GGUF writer produces them concurrently) nor on which other tensors a spec has.
//
// Only integer operations and single roundings are used: math/rand's NormFloat64 relies on
// math.Exp and math.Log, whose results are not guaranteed to be identical on every platform,
// and Go may fuse x*y+z into one FMA on some architectures. Either would change the bytes of
// a generated file, and the golden test checks those bytes by hash.
type rng struct{ pcg *rand.PCG }

func newRNG(seed uint64, name string) *rng {
	h := fnv.New64a()
	h.Write([]byte(name))
	return &rng{rand.NewPCG(seed, h.Sum64())}
}

// uniform returns a value in [0, 1) with 53 random bits; the product is exact.
func (r *rng) uniform() float64 {
	return float64(r.pcg.Uint64()>>11) * 0x1p-53
}

// sym returns a value uniform in [-1, 1).
func (r *rng) sym() float64 {
	return float64(2*r.uniform()) - 1
}

// normal returns an approximately standard normal value: the Irwin-Hall sum of four uniforms,
// centred and scaled to unit variance. Its tails are bounded (|x| < 3.47), which is harmless
// here and keeps quantization scales from being set by one freak outlier.
func (r *rng) normal() float64 {
	s := r.uniform() + r.uniform() + r.uniform() + r.uniform()
	// Var of one uniform is 1/12; four of them: 1/3. sqrt(3) restores unit variance.
	return float64(s-2) * 1.7320508075688772
}

// intn returns a value in [0, n).
func (r *rng) intn(n int) int {
	return int(r.pcg.Uint64() % uint64(n))
}
