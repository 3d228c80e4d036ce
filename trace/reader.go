package trace

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
)

// Reader streams the tokens of a trace back, one chunk in memory at a time. It is not safe
// for concurrent use.
type Reader struct {
	r      *bufio.Reader
	closer io.Closer // the file Open opened; nil when the caller owns the reader
	h      Header
	lay    layout
	off    int64  // bytes consumed so far
	buf    []byte // payload of the current chunk
	chunk  int64  // chunks read so far
	at     int64  // byte offset of the current chunk's frame
	left   int    // records of the current chunk not yet returned
	next   int    // offset in buf of the next record
	tokens int64  // records returned
	seen   []uint64
	err    error // sticky: io.EOF after the end frame, or the first failure
}

// NewReader reads and validates the preamble of a trace. The header's dimensions bound
// every later allocation, and lengths in the file are checked against them before any
// buffer grows, so no content, however damaged, makes the reader allocate much beyond the
// data it has actually read (and never more than MaxChunkBytes for one chunk).
func NewReader(r io.Reader) (*Reader, error) {
	tr := &Reader{r: bufio.NewReaderSize(r, 64<<10)}
	var pre [len(magic) + 8]byte
	if err := tr.full(pre[:]); err != nil {
		return nil, fmt.Errorf("trace: preamble: %w", err)
	}
	if string(pre[:len(magic)]) != magic {
		return nil, fmt.Errorf("trace: %w", ErrNotTrace)
	}
	le := binary.LittleEndian
	if v := le.Uint32(pre[len(magic):]); v != Version {
		return nil, fmt.Errorf("trace: version %d, this reader knows %d: %w", v, Version, ErrVersion)
	}
	n := le.Uint32(pre[len(magic)+4:])
	if n < 2 || n > maxHeaderJSON {
		return nil, fmt.Errorf("trace: header JSON length %d: want 2..%d: %w", n, maxHeaderJSON, ErrCorrupt)
	}
	js, err := tr.grow(nil, int(n))
	if err != nil {
		return nil, fmt.Errorf("trace: header JSON: %w", err)
	}
	var crc [4]byte
	if err := tr.full(crc[:]); err != nil {
		return nil, fmt.Errorf("trace: header checksum: %w", err)
	}
	if got, want := crc32.Checksum(js, castagnoli), le.Uint32(crc[:]); got != want {
		return nil, fmt.Errorf("trace: header checksum %08x, stored %08x: %w", got, want, ErrCorrupt)
	}
	if err := json.Unmarshal(js, &tr.h); err != nil {
		return nil, fmt.Errorf("trace: header JSON: %v: %w", err, ErrCorrupt)
	}
	tr.h = tr.h.normalized()
	if tr.lay, err = tr.h.layout(); err != nil {
		return nil, fmt.Errorf("trace: header: %v: %w", err, ErrCorrupt)
	}
	tr.seen = make([]uint64, (tr.h.Experts+63)/64)
	return tr, nil
}

// Open opens the trace at path; Close closes the file.
func Open(path string) (*Reader, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	r, err := NewReader(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%w (%s)", err, path)
	}
	r.closer = f
	return r, nil
}

// OpenFor opens the trace at path for a model, named name, of layers MoE layers each
// choosing used of experts experts, and refuses a trace that routes another shape.
func OpenFor(path, name string, layers, experts, used int) (*Reader, error) {
	r, err := Open(path)
	if err != nil {
		return nil, err
	}
	h := r.Header()
	if len(h.MoELayers) != layers || h.Experts != experts || h.Used != used {
		r.Close()
		return nil, fmt.Errorf("trace %s routes %d MoE layers over top-%d of %d experts; shape %s has %d layers, top-%d of %d",
			path, len(h.MoELayers), h.Used, h.Experts, name, layers, used, experts)
	}
	return r, nil
}

// Close closes the file if Open opened it, and otherwise does nothing.
func (r *Reader) Close() error {
	if r.closer == nil {
		return nil
	}
	c := r.closer
	r.closer = nil
	return c.Close()
}

// Header returns the trace's header (a copy).
func (r *Reader) Header() Header { return r.h.normalized() }

// Next returns the next token in a Token of its own. At the end of a complete trace it
// returns io.EOF; a file that ends before its end frame gives ErrTruncated after its last
// complete chunk, and damage gives ErrCorrupt. Errors are sticky.
func (r *Reader) Next() (*Token, error) {
	t := new(Token)
	if err := r.NextInto(t); err != nil {
		return nil, err
	}
	return t, nil
}

// NextInto is Next decoding into t, whose slices are reused when t came from this reader
// before: the loop of a trainer that streams gigabytes then allocates nothing per token.
// Whatever the caller kept of t's slices is overwritten.
func (r *Reader) NextInto(t *Token) error {
	if r.err != nil {
		return r.err
	}
	if r.left == 0 {
		if r.err = r.nextChunk(); r.err != nil {
			return r.err
		}
	}
	size := r.lay.tokenSize
	if err := r.lay.get(r.buf[r.next:r.next+size], t, r.seen); err != nil {
		r.err = fmt.Errorf("trace: chunk %d at byte %d, token %d: %v: %w", r.chunk-1, r.at, r.tokens, err, ErrCorrupt)
		return r.err
	}
	r.next += size
	r.left--
	r.tokens++
	return nil
}

// nextChunk reads frames until a chunk is loaded or the end frame is met (io.EOF).
func (r *Reader) nextChunk() error {
	r.at = r.off
	var f [frameSize]byte
	if err := r.full(f[:]); err != nil {
		if errors.Is(err, ErrTruncated) && r.off == r.at {
			return fmt.Errorf("trace: no end frame after chunk %d (byte %d): %w", r.chunk, r.at, ErrTruncated)
		}
		return r.errf("frame header", err)
	}
	le := binary.LittleEndian
	tag := [4]byte(f[:4])
	count, length, stored := le.Uint32(f[4:]), le.Uint32(f[8:]), le.Uint32(f[12:])
	switch tag {
	case tagTokens:
		size := uint32(r.lay.tokenSize)
		if count == 0 || count > MaxChunkBytes/size || length != count*size {
			return r.errf(fmt.Sprintf("%d tokens in %d bytes, records are %d", count, length, size), ErrCorrupt)
		}
	case tagDone:
		if count != 0 || length != doneSize {
			return r.errf(fmt.Sprintf("end frame with count %d and %d bytes, want 0 and %d", count, length, doneSize), ErrCorrupt)
		}
	default:
		return r.errf(fmt.Sprintf("unknown frame tag %q", tag[:]), ErrCorrupt)
	}
	var err error
	if r.buf, err = r.grow(r.buf, int(length)); err != nil {
		return r.errf("payload", err)
	}
	if got := crc32.Update(crc32.Checksum(f[:12], castagnoli), castagnoli, r.buf); got != stored {
		return r.errf(fmt.Sprintf("checksum %08x, stored %08x", got, stored), ErrCorrupt)
	}
	if tag == tagDone {
		return r.done()
	}
	r.chunk++
	r.left, r.next = int(count), 0
	return nil
}

// done checks the end frame's totals and that nothing follows it, and returns io.EOF.
func (r *Reader) done() error {
	tokens, chunks := binary.LittleEndian.Uint64(r.buf), binary.LittleEndian.Uint64(r.buf[8:])
	if tokens != uint64(r.tokens) || chunks != uint64(r.chunk) {
		return r.errf(fmt.Sprintf("end frame counts %d tokens in %d chunks, read %d in %d", tokens, chunks, r.tokens, r.chunk), ErrCorrupt)
	}
	if _, err := r.r.ReadByte(); err != io.EOF {
		if err != nil {
			return fmt.Errorf("trace: after end frame (byte %d): %w", r.off, err)
		}
		return fmt.Errorf("trace: bytes after the end frame (byte %d): %w", r.off, ErrCorrupt)
	}
	r.buf = nil
	return io.EOF
}

// errf names the frame being read: its index among chunks and its byte offset.
func (r *Reader) errf(what string, err error) error {
	return fmt.Errorf("trace: chunk %d at byte %d: %s: %w", r.chunk, r.at, what, err)
}

// full reads exactly len(b) bytes; an early end of input is ErrTruncated.
func (r *Reader) full(b []byte) error {
	n, err := io.ReadFull(r.r, b)
	r.off += int64(n)
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		return fmt.Errorf("%d of %d bytes: %w", n, len(b), ErrTruncated)
	}
	return err
}

// grow reads n bytes into buf (reusing its storage), growing it at most readStep ahead of
// the data that has arrived.
func (r *Reader) grow(buf []byte, n int) ([]byte, error) {
	buf = buf[:0]
	for len(buf) < n {
		step := min(n-len(buf), readStep)
		if cap(buf)-len(buf) < step {
			// Doubling keeps the copying linear; the cap stays within twice what arrived.
			nb := make([]byte, len(buf), min(n, max(len(buf)+step, 2*len(buf))))
			copy(nb, buf)
			buf = nb
		}
		m, err := io.ReadFull(r.r, buf[len(buf):len(buf)+step])
		buf = buf[:len(buf)+m]
		r.off += int64(m)
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return buf, fmt.Errorf("%d of %d bytes: %w", len(buf), n, ErrTruncated)
		}
		if err != nil {
			return buf, err
		}
	}
	return buf, nil
}
