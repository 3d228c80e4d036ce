package multigpu

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/commit-run/commit-run/nccl"
)

// Rendezvous hands the processes of a group the NCCL id their communicators are made from.
// Rank 0 makes the id and listens at addr (host:port); every other rank connects, says who it
// is, and is given the id once all nranks have arrived. It is NCCL's bootstrap, not a
// collective: the tokens move through NCCL alone.
//
// The processes must run the same group: a rank that reports another group size or another
// fingerprint (the caller's summary of what it runs: the model, the planner) is refused, and
// so is a rank that arrives twice. Every process gives up with an error after timeout, or
// when ctx ends.
type Rendezvous struct {
	Addr        string
	Ranks, Rank int
	Fingerprint string
	Timeout     time.Duration
}

// rendezvousMagic opens every message, so that a stray connection is told apart.
const rendezvousMagic = "commit-run-ep/1\n"

// Run returns the group's id: rank 0 makes it with newID.
func (rv Rendezvous) Run(ctx context.Context, newID func() (nccl.UniqueID, error)) (nccl.UniqueID, error) {
	if rv.Ranks < 2 || rv.Rank < 0 || rv.Rank >= rv.Ranks {
		return nccl.UniqueID{}, fmt.Errorf("rendezvous: rank %d of %d", rv.Rank, rv.Ranks)
	}
	if len(rv.Fingerprint) > 1<<12 {
		return nccl.UniqueID{}, fmt.Errorf("rendezvous: a fingerprint of %d bytes", len(rv.Fingerprint))
	}
	if rv.Timeout <= 0 {
		rv.Timeout = 5 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, rv.Timeout)
	defer cancel()
	var id nccl.UniqueID
	var err error
	if rv.Rank == 0 {
		id, err = rv.serve(ctx, newID)
	} else {
		id, err = rv.join(ctx)
	}
	if err != nil {
		return nccl.UniqueID{}, fmt.Errorf("rendezvous of %d processes at %s, rank %d: %w", rv.Ranks, rv.Addr, rv.Rank, err)
	}
	return id, nil
}

// hello is what a rank sends: the group size, its rank and the fingerprint.
func (rv Rendezvous) hello() []byte {
	b := []byte(rendezvousMagic)
	b = binary.LittleEndian.AppendUint32(b, uint32(rv.Ranks))
	b = binary.LittleEndian.AppendUint32(b, uint32(rv.Rank))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(rv.Fingerprint)))
	return append(b, rv.Fingerprint...)
}

func readHello(r io.Reader) (ranks, rank int, fp string, err error) {
	head := make([]byte, len(rendezvousMagic)+12)
	if _, err := io.ReadFull(r, head); err != nil {
		return 0, 0, "", err
	}
	if string(head[:len(rendezvousMagic)]) != rendezvousMagic {
		return 0, 0, "", errors.New("not a commit-run rank")
	}
	h := head[len(rendezvousMagic):]
	ranks, rank = int(binary.LittleEndian.Uint32(h)), int(binary.LittleEndian.Uint32(h[4:]))
	n := binary.LittleEndian.Uint32(h[8:])
	if n > 1<<12 {
		return 0, 0, "", fmt.Errorf("a fingerprint of %d bytes", n)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return 0, 0, "", err
	}
	return ranks, rank, string(b), nil
}

// The answer: a status byte (0: the id follows; 1: a refusal's length and text follow).
func answer(c net.Conn, id *nccl.UniqueID, refusal string) error {
	if refusal != "" {
		b := binary.LittleEndian.AppendUint32([]byte{1}, uint32(len(refusal)))
		_, err := c.Write(append(b, refusal...))
		return err
	}
	_, err := c.Write(append([]byte{0}, id[:]...))
	return err
}

// serve is rank 0: it waits for every other rank, checks them and answers them all.
func (rv Rendezvous) serve(ctx context.Context, newID func() (nccl.UniqueID, error)) (nccl.UniqueID, error) {
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "tcp", rv.Addr)
	if err != nil {
		return nccl.UniqueID{}, err
	}
	defer l.Close()
	stop := context.AfterFunc(ctx, func() { l.Close() })
	defer stop()
	joined := make([]net.Conn, rv.Ranks)
	defer func() {
		for _, c := range joined {
			if c != nil {
				c.Close()
			}
		}
	}()
	for waiting := rv.Ranks - 1; waiting > 0; {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nccl.UniqueID{}, fmt.Errorf("%d of %d ranks never arrived: %w", waiting, rv.Ranks-1, ctx.Err())
			}
			return nccl.UniqueID{}, err
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		ranks, rank, fp, err := readHello(bufio.NewReader(c))
		var refusal string
		switch {
		case err != nil:
			// A stray connection (a port scan, a health check) is not a rank: ignore it.
			c.Close()
			continue
		case ranks != rv.Ranks:
			refusal = fmt.Sprintf("rank %d runs a group of %d processes; rank 0 runs %d", rank, ranks, rv.Ranks)
		case rank < 1 || rank >= rv.Ranks:
			refusal = fmt.Sprintf("rank %d is not one of 1 to %d", rank, rv.Ranks-1)
		case joined[rank] != nil:
			refusal = fmt.Sprintf("rank %d arrived twice", rank)
		case fp != rv.Fingerprint:
			refusal = fmt.Sprintf("rank %d runs %q; rank 0 runs %q", rank, fp, rv.Fingerprint)
		}
		if refusal != "" {
			answer(c, nil, refusal)
			c.Close()
			// A mismatched group cannot start: every rank must be restarted right.
			return nccl.UniqueID{}, errors.New(refusal)
		}
		joined[rank] = c
		waiting--
	}
	id, err := newID()
	if err != nil {
		return nccl.UniqueID{}, err
	}
	for r, c := range joined {
		if c == nil {
			continue
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if err := answer(c, &id, ""); err != nil {
			return nccl.UniqueID{}, fmt.Errorf("handing rank %d the id: %w", r, err)
		}
	}
	return id, nil
}

// join is every other rank: it connects (retrying until rank 0 listens) and reads the id.
func (rv Rendezvous) join(ctx context.Context) (nccl.UniqueID, error) {
	var d net.Dialer
	var c net.Conn
	for {
		var err error
		if c, err = d.DialContext(ctx, "tcp", rv.Addr); err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return nccl.UniqueID{}, fmt.Errorf("rank 0 never answered (%v): %w", err, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	if _, err := c.Write(rv.hello()); err != nil {
		return nccl.UniqueID{}, err
	}
	r := bufio.NewReader(c)
	status, err := r.ReadByte()
	if err != nil {
		if ctx.Err() != nil {
			return nccl.UniqueID{}, fmt.Errorf("waiting for the other ranks: %w", ctx.Err())
		}
		return nccl.UniqueID{}, err
	}
	if status != 0 {
		var n [4]byte
		if _, err := io.ReadFull(r, n[:]); err != nil {
			return nccl.UniqueID{}, err
		}
		msg := make([]byte, min(binary.LittleEndian.Uint32(n[:]), 1<<13))
		io.ReadFull(r, msg)
		return nccl.UniqueID{}, fmt.Errorf("rank 0 refused: %s", msg)
	}
	var id nccl.UniqueID
	if _, err := io.ReadFull(r, id[:]); err != nil {
		return nccl.UniqueID{}, err
	}
	return id, nil
}
