package cuda

import (
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"testing"
	"unsafe"

	"github.com/ebitengine/purego"
)

// A GPU runs a block's threads, and a grid's blocks, in no promised order. The fake driver
// runs them in index order unless $FAKECUDA_SCHEDULE says otherwise, so a kernel that reads
// another thread's write without a barrier between them, or that needs one block to run before
// another, could pass there and fail on a card. TestKernelsAnySchedule runs every kernel case
// again with the threads and blocks reversed (and each warp running as far as it can before the
// next), and shuffled at every round.
func TestKernelsAnySchedule(t *testing.T) {
	k := openKernels(t)
	if k.real {
		t.Skip("the schedules are the fake driver's; a GPU chooses its own order")
	}
	firstOrder, err := purego.Dlsym(k.ctx.d.handle, "fake_first_order")
	if err != nil {
		t.Fatal(err)
	}
	// order is the order the last launch's last block's threads first ran in.
	order := func() []int32 {
		var out [1024]int32
		n, _, _ := purego.SyscallN(firstOrder, uintptr(unsafe.Pointer(&out[0])))
		return slices.Clone(out[:n])
	}
	// A schedule the emulator does not know fails the launch, rather than testing in order.
	t.Run("unknown", func(t *testing.T) {
		t.Setenv("FAKECUDA_SCHEDULE", "sideways")
		f, err := k.mod.Function(KernelNames[0])
		if err != nil {
			t.Fatal(err)
		}
		if err := k.s.Launch(f, Dim3{X: 1}, Dim3{X: 32}, 0, &Args{}); err == nil {
			t.Error("FAKECUDA_SCHEDULE=sideways: the launch succeeded")
		}
	})
	cases := allKernelCases()
	for _, sched := range []string{"reverse", "shuffle:1", "shuffle:2"} {
		t.Run(sched, func(t *testing.T) {
			t.Setenv("FAKECUDA_SCHEDULE", sched)
			for _, c := range cases {
				t.Run(c.kernel+"/"+c.name, func(t *testing.T) {
					h := fnv.New64a()
					h.Write([]byte(c.kernel + "/" + c.name))
					c.run(t, k, rand.New(rand.NewPCG(h.Sum64(), 1)))
					// The schedule took effect: the last block first ran its n threads in the
					// reverse of index order, or in neither order.
					o := order()
					n := int32(len(o))
					if n == 0 {
						t.Fatal("no block ran")
					}
					var fwd, rev int
					for i, th := range o {
						fwd += b2i(th == int32(i))
						rev += b2i(th == n-1-int32(i))
					}
					for i, th := range slices.Sorted(slices.Values(o)) {
						if th != int32(i) {
							t.Fatalf("the last block first ran threads %v: not each of 0..%d once", o, n-1)
						}
					}
					switch {
					case sched == "reverse" && rev != int(n):
						t.Errorf("reverse: the last block first ran threads %v", o)
					case sched != "reverse" && n >= 32 && (fwd == int(n) || rev == int(n)):
						t.Errorf("%s: the last block first ran its %d threads in order: %v", sched, n, o)
					}
				})
			}
		})
	}
}
