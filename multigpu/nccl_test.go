package multigpu

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/commit-run/commit-run/cpu"
	"github.com/commit-run/commit-run/cuda"
	"github.com/commit-run/commit-run/internal/fakecuda"
	"github.com/commit-run/commit-run/internal/fakenccl"
	"github.com/commit-run/commit-run/nccl"
)

// fakeGPUs opens n GPUs of the fake CUDA driver and loads the fake NCCL, or skips without a
// C compiler to build them.
func fakeGPUs(t *testing.T, n int) (*nccl.Library, []*cuda.GPU) {
	t.Helper()
	cudaLib, ncclLib := fakecuda.ForTests(t), fakenccl.ForTests(t)
	t.Setenv("FAKECUDA_DEVICES", fmt.Sprint(n))
	lib, err := nccl.Load(ncclLib)
	if err != nil {
		t.Fatal(err)
	}
	var gpus []*cuda.GPU
	for r := range n {
		g, err := cuda.Open(cuda.GPUOptions{Ordinal: r, Library: cudaLib, Host: cpu.New(1), Budget: 64 << 20})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { g.Close() })
		gpus = append(gpus, g)
	}
	return lib, gpus
}

// runNCCL calls fn on every rank of g at once, as the engine's step does: a failing rank
// aborts the group.
func runNCCL(g *NCCLGroup, n int, fn func(c Comm) error) []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if errs[r] = fn(g.Comm(r)); errs[r] != nil {
				g.Abort(errs[r])
			}
		}()
	}
	wg.Wait()
	return errs
}

// The NCCL transport moves what the in-process one moves: every size (empty ones too), the
// buffers reused over rounds, and the all-gathers built on it.
func TestNCCLAllToAll(t *testing.T) {
	for _, n := range []int{1, 2, 3, 4} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			lib, gpus := fakeGPUs(t, n)
			g, err := NewNCCL(lib, gpus)
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			errs := runNCCL(g, n, func(c Comm) error {
				i := c.Rank()
				if c.Size() != n {
					return fmt.Errorf("size %d", c.Size())
				}
				send, recv := make([][]byte, n), make([][]byte, n)
				for round := range 12 {
					for j := range n {
						// Some messages are empty, some cross the staging alignment.
						k := (j + i + round) % 5 * 300
						send[j] = bytes.Repeat([]byte{byte(16*i + j + round)}, k)
						recv[j] = make([]byte, k)
					}
					if err := c.AllToAll(send, recv); err != nil {
						return err
					}
					for j := range n {
						k := (i + j + round) % 5 * 300
						if want := bytes.Repeat([]byte{byte(16*j + i + round)}, k); !bytes.Equal(recv[j], want) {
							return fmt.Errorf("round %d: rank %d got %d bytes from %d, want %d of %d", round, i, len(recv[j]), j, k, want[0])
						}
					}
				}
				v, err := AllGatherInt(c, int64(100*i-7))
				if err != nil {
					return err
				}
				for j, x := range v {
					if x != int64(100*j-7) {
						return fmt.Errorf("all-gather: rank %d has %d from %d", i, x, j)
					}
				}
				return nil
			})
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A rank that fails releases the others with its error, and Reset makes the group usable
// again; bad arguments are errors.
func TestNCCLAbortAndReset(t *testing.T) {
	const n = 3
	lib, gpus := fakeGPUs(t, n)
	g, err := NewNCCL(lib, gpus)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	boom := errors.New("rank 2 ran out of memory")
	errs := runNCCL(g, n, func(c Comm) error {
		if c.Rank() == 2 {
			return boom
		}
		send, recv := make([][]byte, n), make([][]byte, n)
		for j := range n {
			send[j], recv[j] = make([]byte, 64), make([]byte, 64)
		}
		return c.AllToAll(send, recv)
	})
	for r, err := range errs {
		if !errors.Is(err, boom) {
			t.Errorf("rank %d: %v, want the failing rank's error", r, err)
		}
	}
	if err := g.Reset(); err != nil {
		t.Fatal(err)
	}
	errs = runNCCL(g, n, func(c Comm) error {
		_, err := AllGatherInt(c, int64(c.Rank()))
		return err
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("after Reset: %v", err)
	}
	if err := g.Comm(0).AllToAll(make([][]byte, 2), make([][]byte, n)); err == nil || !strings.Contains(err.Error(), "2 send and 3 receive buffers") {
		t.Errorf("wrong buffer count: %v", err)
	}
	if err := g.Reset(); err != nil {
		t.Fatal(err)
	}
	if _, err := NewNCCL(lib, []*cuda.GPU{gpus[0], gpus[0]}); err == nil || !strings.Contains(err.Error(), "cuda:0 holds two ranks") {
		t.Errorf("one GPU twice: %v", err)
	}
}
