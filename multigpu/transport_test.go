package multigpu

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
)

// runRanks calls fn on every rank of an in-process group of n at once and returns their errors.
func runRanks(t *testing.T, g *LocalGroup, n int, fn func(c Comm) error) []error {
	t.Helper()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = fn(g.Comm(r))
			if errs[r] != nil {
				g.Abort(errs[r])
			}
		}()
	}
	wg.Wait()
	return errs
}

func TestLocalAllToAll(t *testing.T) {
	for _, n := range []int{1, 2, 3, 8} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			g, err := NewLocal(n)
			if err != nil {
				t.Fatal(err)
			}
			// Rank i sends j+i+round bytes of value 16*i+j to rank j, over several rounds
			// with the buffers reused, so that a copy racing the next round would show.
			errs := runRanks(t, g, n, func(c Comm) error {
				i := c.Rank()
				send, recv := make([][]byte, n), make([][]byte, n)
				for round := range 20 {
					for j := range n {
						send[j] = bytes.Repeat([]byte{byte(16*i + j + round)}, j+i+round)
						recv[j] = make([]byte, i+j+round)
					}
					if err := c.AllToAll(send, recv); err != nil {
						return err
					}
					for j := range n {
						want := bytes.Repeat([]byte{byte(16*j + i + round)}, i+j+round)
						if !bytes.Equal(recv[j], want) {
							return fmt.Errorf("round %d: rank %d got %v from %d, want %v", round, i, recv[j], j, want)
						}
					}
				}
				v, err := AllGatherInt(c, int64(100*i-7))
				if err != nil {
					return err
				}
				for j, x := range v {
					if x != int64(100*j-7) {
						return fmt.Errorf("all-gather: rank %d got %d from %d", i, x, j)
					}
				}
				return nil
			})
			for r, err := range errs {
				if err != nil {
					t.Errorf("rank %d: %v", r, err)
				}
			}
		})
	}
}

func TestLocalAbort(t *testing.T) {
	const n = 4
	g, err := NewLocal(n)
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("rank 2 failed")
	// Rank 2 fails before its collective: the others must return, with its error.
	errs := runRanks(t, g, n, func(c Comm) error {
		if c.Rank() == 2 {
			return boom
		}
		_, err := AllGatherInt(c, 1)
		return err
	})
	for r, err := range errs {
		if !errors.Is(err, boom) {
			t.Errorf("rank %d: %v, want %v", r, err, boom)
		}
	}
	// A size mismatch is every rank's error, not a hang or a short copy.
	g.Reset()
	errs = runRanks(t, g, n, func(c Comm) error {
		sizes := []int{8, 8, 8, 8}
		if c.Rank() == 1 {
			sizes[3] = 4
		}
		_, err := AllGather(c, make([]byte, 8), sizes)
		return err
	})
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "expects 4") {
			t.Errorf("rank %d: %v, want the mismatch", r, err)
		}
	}
	// After Reset the group works again.
	g.Reset()
	errs = runRanks(t, g, n, func(c Comm) error {
		_, err := AllGatherInt(c, 3)
		return err
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("after reset, rank %d: %v", r, err)
		}
	}
	if _, err := NewLocal(0); err == nil {
		t.Error("a group of 0 ranks was made")
	}
}

// fakeLink is a device clock: ready at a set time, recording transfers.
type fakeLink struct {
	ready      float64
	start, end float64
}

func (f *fakeLink) Ready() float64 { return f.ready }
func (f *fakeLink) Transfer(start, end float64) {
	f.start, f.end = start, end
	f.ready = end
}

func TestModelledLink(t *testing.T) {
	const n = 3
	g, err := NewLocal(n)
	if err != nil {
		t.Fatal(err)
	}
	link := Link{Bandwidth: 1e9, Latency: 1e-5}
	devs := []*fakeLink{{ready: 1}, {ready: 3}, {ready: 2}}
	// Rank i sends 1000*(i+1)*(j+1) bytes to rank j. Rank 2 sends 3000+6000 = 9000 bytes
	// to others and receives 3000+6000 = 9000: the busiest link's 9000 bytes.
	errs := runRanks(t, g, n, func(c Comm) error {
		mc, err := Modelled(c, devs[c.Rank()], link)
		if err != nil {
			return err
		}
		i := c.Rank()
		send, recv := make([][]byte, n), make([][]byte, n)
		for j := range n {
			send[j], recv[j] = make([]byte, 1000*(i+1)*(j+1)), make([]byte, 1000*(i+1)*(j+1))
		}
		return mc.AllToAll(send, recv)
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	want := 3 + 1e-5 + 9000/1e9
	for r, d := range devs {
		if d.start != 3 || math.Abs(d.end-want) > 1e-12 {
			t.Errorf("rank %d: transfer %v..%v, want 3..%v", r, d.start, d.end, want)
		}
	}
	if _, err := Modelled(g.Comm(0), devs[0], Link{}); err == nil {
		t.Error("a link of 0 bytes/s was accepted")
	}
}
