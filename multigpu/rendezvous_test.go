package multigpu

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/commit-run/commit-run/nccl"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// runRendezvous runs one process per Rendezvous at once and returns their ids and errors.
func runRendezvous(rvs []Rendezvous, before func()) ([]nccl.UniqueID, []error) {
	ids, errs := make([]nccl.UniqueID, len(rvs)), make([]error, len(rvs))
	done := make(chan int)
	newID := func() (nccl.UniqueID, error) {
		var id nccl.UniqueID
		copy(id[:], "the group's id")
		return id, nil
	}
	for i, rv := range rvs {
		go func() {
			ids[i], errs[i] = rv.Run(context.Background(), newID)
			done <- i
		}()
		if i == 0 && before != nil {
			time.Sleep(50 * time.Millisecond)
			before()
		}
	}
	for range rvs {
		<-done
	}
	return ids, errs
}

func TestRendezvous(t *testing.T) {
	addr := freeAddr(t)
	rv := func(ranks, rank int, fp string) Rendezvous {
		return Rendezvous{Addr: addr, Ranks: ranks, Rank: rank, Fingerprint: fp, Timeout: 5 * time.Second}
	}
	// Every rank gets rank 0's id, whatever the order of arrival, and a stray connection
	// that is not a rank is ignored.
	ids, errs := runRendezvous([]Rendezvous{rv(4, 0, "m"), rv(4, 3, "m"), rv(4, 1, "m"), rv(4, 2, "m")}, func() {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Write([]byte("GET / HTTP/1.0\r\n\r\n"))
			c.Close()
		}
	})
	for r, err := range errs {
		if err != nil || !strings.HasPrefix(string(ids[r][:]), "the group's id") {
			t.Errorf("rank %d: %q, %v", r, ids[r][:16], err)
		}
	}
	for _, c := range []struct {
		name string
		rvs  []Rendezvous
		want string
	}{
		{"group size", []Rendezvous{rv(2, 0, "m"), rv(3, 1, "m")}, "runs a group of 3 processes; rank 0 runs 2"},
		{"fingerprint", []Rendezvous{rv(2, 0, "qwen"), rv(2, 1, "mixtral")}, `rank 1 runs "mixtral"; rank 0 runs "qwen"`},
		{"twice", []Rendezvous{rv(3, 0, "m"), rv(3, 1, "m"), rv(3, 1, "m")}, "rank 1 arrived twice"},
	} {
		_, errs := runRendezvous(c.rvs, nil)
		if errs[0] == nil || !strings.Contains(errs[0].Error(), c.want) {
			t.Errorf("%s: rank 0: %v, want %q", c.name, errs[0], c.want)
		}
		var refused bool
		for _, err := range errs[1:] {
			if err == nil {
				t.Errorf("%s: a rank joined", c.name)
			} else if strings.Contains(err.Error(), "rank 0 refused: ") && strings.Contains(err.Error(), c.want) {
				refused = true
			}
		}
		if !refused {
			t.Errorf("%s: no rank was told why: %v", c.name, errs)
		}
	}
	short := Rendezvous{Addr: addr, Ranks: 2, Rank: 0, Timeout: 200 * time.Millisecond}
	if _, errs := runRendezvous([]Rendezvous{short}, nil); errs[0] == nil || !strings.Contains(errs[0].Error(), "1 of 1 ranks never arrived") {
		t.Errorf("alone: %v", errs[0])
	}
	short.Rank = 1
	if _, errs := runRendezvous([]Rendezvous{short}, nil); errs[0] == nil || !strings.Contains(errs[0].Error(), "rank 0 never answered") {
		t.Errorf("no rank 0: %v", errs[0])
	}
	for _, bad := range []Rendezvous{{Addr: addr, Ranks: 1}, {Addr: addr, Ranks: 2, Rank: 2}, {Addr: addr, Ranks: 2, Rank: -1}} {
		if _, err := bad.Run(context.Background(), nil); err == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
}
