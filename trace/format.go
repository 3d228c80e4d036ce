package trace

import (
	"errors"
	"fmt"
	"hash/crc32"
	"math"
)

// Version is the format version this package writes and reads.
const Version = 1

// MaxChunkBytes bounds a chunk's payload and therefore a token record: the most a reader
// ever buffers, whatever a file claims.
const MaxChunkBytes = 64 << 20

const (
	magic = "CRTRACE\x00"

	maxHeaderJSON = 256 << 10
	maxLayers     = 1 << 12
	maxExperts    = 1<<16 - 1 // expert ids are stored as u16
	maxEmbd       = 1 << 20

	frameSize = 16 // tag, count, length, crc
	doneSize  = 16 // u64 tokens, u64 chunks

	// Writer's chunk target: big enough that per-chunk overhead (16 bytes, one write call)
	// vanishes, small enough that a killed recorder loses little and readers stay small.
	chunkTarget    = 1 << 20
	chunkMaxTokens = 256

	// readStep bounds how far a reader grows its buffer ahead of the bytes that actually
	// arrived, so a corrupt length cannot make it allocate for data that is not there.
	readStep = 1 << 20
)

var (
	tagTokens = [4]byte{'T', 'O', 'K', 'S'}
	tagDone   = [4]byte{'D', 'O', 'N', 'E'}
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

var (
	// ErrNotTrace reports a file that does not start with the trace magic.
	ErrNotTrace = errors.New("not a routing trace (bad magic)")
	// ErrVersion reports a trace of a format version this package does not read.
	ErrVersion = errors.New("unsupported trace format version")
	// ErrCorrupt reports damaged content: a checksum mismatch, an impossible length, a value
	// out of range, or a file that ends early (ErrTruncated).
	ErrCorrupt = errors.New("corrupt trace")
	// ErrTruncated reports a file that ends before its end frame. It matches ErrCorrupt too.
	ErrTruncated = fmt.Errorf("%w: file ends early", ErrCorrupt)
)

// finite reports whether v is neither infinite nor NaN: the exponent is not all ones.
func finite(v float32) bool { return math.Float32bits(v)&0x7f800000 != 0x7f800000 }

// finite16 is finite for a binary16 bit pattern.
func finite16(h uint16) bool { return h&0x7c00 != 0x7c00 }
