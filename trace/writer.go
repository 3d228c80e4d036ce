package trace

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
)

// Writer streams tokens into a trace. It buffers one chunk (up to 256 tokens or about
// 1 MiB, at least one token) and writes each full chunk with a single Write call. It is not
// safe for concurrent use.
type Writer struct {
	w      io.Writer
	closer io.Closer // the file Create opened; nil when the caller owns w
	h      Header
	lay    layout
	buf    []byte // frame header followed by the pending records
	n      int    // pending records
	per    int    // records per chunk
	tokens int64  // records accepted
	chunks int64  // chunks written
	seen   []uint64
	err    error // first write error: the stream is broken after it
	closed bool
}

// NewWriter validates h, writes the preamble to w and returns a Writer for the tokens. Close
// finishes the trace but does not close w.
func NewWriter(w io.Writer, h Header) (*Writer, error) {
	h = h.normalized()
	lay, err := h.layout()
	if err != nil {
		return nil, fmt.Errorf("trace: header: %w", err)
	}
	js, err := encodeHeader(&h)
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	pre := make([]byte, 0, len(magic)+12+len(js))
	pre = append(pre, magic...)
	pre = binary.LittleEndian.AppendUint32(pre, Version)
	pre = binary.LittleEndian.AppendUint32(pre, uint32(len(js)))
	pre = append(pre, js...)
	pre = binary.LittleEndian.AppendUint32(pre, crc32.Checksum(js, castagnoli))
	if _, err := w.Write(pre); err != nil {
		return nil, fmt.Errorf("trace: write header: %w", err)
	}
	per := min(chunkMaxTokens, max(1, chunkTarget/lay.tokenSize))
	return &Writer{
		w: w, h: h, lay: lay, per: per,
		buf:  make([]byte, frameSize+per*lay.tokenSize),
		seen: make([]uint64, (h.Experts+63)/64),
	}, nil
}

// Create creates (or truncates) the file at path and returns a Writer that owns it: Close
// finishes the trace and closes the file. On error no file is left behind.
func Create(path string, h Header) (*Writer, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	w, err := NewWriter(f, h)
	if err != nil {
		f.Close()
		os.Remove(path)
		return nil, fmt.Errorf("%w (%s)", err, path)
	}
	w.closer = f
	return w, nil
}

// Header returns the trace's header as written (Inputs spelled out).
func (w *Writer) Header() Header { return w.h.normalized() }

// Write checks t against the header and appends it to the trace: every MoE layer in order,
// Used distinct experts in range, Used weights, logits and input of the declared lengths
// (empty when not stored), all values finite and f16 inputs within f16's range. A token that
// fails is rejected with an error naming it and its layer, and the trace goes on without it.
// Write copies t; the caller may reuse it.
func (w *Writer) Write(t *Token) error {
	if w.closed {
		return errors.New("trace: write after close")
	}
	if w.err != nil {
		return w.err
	}
	off := frameSize + w.n*w.lay.tokenSize
	if err := w.lay.put(w.buf[off:off+w.lay.tokenSize], t, w.seen); err != nil {
		if t == nil {
			return fmt.Errorf("trace: token %d: %w", w.tokens, err)
		}
		return fmt.Errorf("trace: token %d (seq %d, pos %d): %w", w.tokens, t.Seq, t.Pos, err)
	}
	w.n++
	w.tokens++
	if w.n == w.per {
		return w.Flush()
	}
	return nil
}

// Flush writes the pending tokens as a chunk now, so that a recorder which dies later loses
// none of them. Chunks are written whole when full anyway; flushing often only makes them
// smaller.
func (w *Writer) Flush() error {
	if w.err != nil || w.n == 0 {
		return w.err
	}
	size := w.n * w.lay.tokenSize
	w.err = w.frame(w.buf[:frameSize+size], tagTokens, uint32(w.n))
	if w.err != nil {
		w.err = fmt.Errorf("trace: write chunk %d: %w", w.chunks, w.err)
		return w.err
	}
	w.n = 0
	w.chunks++
	return nil
}

// frame fills in the frame header at the start of b, whose payload follows it, and writes b.
func (w *Writer) frame(b []byte, tag [4]byte, count uint32) error {
	le := binary.LittleEndian
	copy(b, tag[:])
	le.PutUint32(b[4:], count)
	le.PutUint32(b[8:], uint32(len(b)-frameSize))
	crc := crc32.Update(crc32.Checksum(b[:12], castagnoli), castagnoli, b[frameSize:])
	le.PutUint32(b[12:], crc)
	_, err := w.w.Write(b)
	return err
}

// Close flushes the pending tokens and writes the end frame, without which a reader reports
// the trace as truncated; it closes the file if Create opened it. Further calls return nil.
func (w *Writer) Close() error {
	if w.closed {
		return nil
	}
	w.closed = true
	err := w.Flush()
	if err == nil {
		var b [frameSize + doneSize]byte
		binary.LittleEndian.PutUint64(b[frameSize:], uint64(w.tokens))
		binary.LittleEndian.PutUint64(b[frameSize+8:], uint64(w.chunks))
		if err = w.frame(b[:], tagDone, 0); err != nil {
			err = fmt.Errorf("trace: write end frame: %w", err)
		}
	}
	if w.closer != nil {
		if cerr := w.closer.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("trace: %w", cerr)
		}
	}
	w.buf = nil
	return err
}
