// Package quant holds the ggml tensor types commit-run reads from GGUF files: their block
// layouts, dequantization, the quantization of activations to each weight's dot type, the
// dot products between a quantized weight row and a quantized activation row, and matrix
// products built on them (X86Rows: tiles of eight weight rows against many activation rows,
// and one call for all the rows of a product of one activation row).
//
// The plain-Go functions are the reference, and what builds with -tags purego or for other
// architectures run. On amd64 CPUs with AVX2, FMA and F16C, assembly written by
// internal/asmgen (dot products, tiles, activation quantizers) is chosen once at start-up;
// every variant computes exactly what its Go reference computes and is tested against it.
package quant

import "fmt"

// Type is a ggml tensor type; the values are ggml's own ids as stored in GGUF.
type Type uint32

// The ggml type ids this package knows.
const (
	F32    Type = 0
	F16    Type = 1
	Q4_0   Type = 2
	Q4_1   Type = 3
	Q5_0   Type = 6
	Q5_1   Type = 7
	Q8_0   Type = 8
	Q8_1   Type = 9
	Q2_K   Type = 10
	Q3_K   Type = 11
	Q4_K   Type = 12
	Q5_K   Type = 13
	Q6_K   Type = 14
	Q8_K   Type = 15
	IQ4_NL Type = 20
	BF16   Type = 30
	MXFP4  Type = 39
)

type typeInfo struct {
	name       string
	blockSize  int  // elements per block
	blockBytes int  // bytes per block
	weight     bool // allowed as a model weight
	dot        Type // the type activations are rounded to before a dot product with this type
}

// types is indexed by Type; an array rather than a map because hot loops ask for block sizes.
var types = [...]typeInfo{
	F32:    {"F32", 1, 4, true, F32},
	F16:    {"F16", 1, 2, true, F16},
	BF16:   {"BF16", 1, 2, true, BF16},
	Q4_0:   {"Q4_0", 32, 18, true, Q8_0},
	Q4_1:   {"Q4_1", 32, 20, true, Q8_1},
	Q5_0:   {"Q5_0", 32, 22, true, Q8_0},
	Q5_1:   {"Q5_1", 32, 24, true, Q8_1},
	Q8_0:   {"Q8_0", 32, 34, true, Q8_0},
	Q8_1:   {"Q8_1", 32, 36, false, Q8_1},
	IQ4_NL: {"IQ4_NL", 32, 18, true, Q8_0},
	MXFP4:  {"MXFP4", 32, 17, true, Q8_0},
	Q2_K:   {"Q2_K", 256, 84, true, Q8_K},
	Q3_K:   {"Q3_K", 256, 110, true, Q8_K},
	Q4_K:   {"Q4_K", 256, 144, true, Q8_K},
	Q5_K:   {"Q5_K", 256, 176, true, Q8_K},
	Q6_K:   {"Q6_K", 256, 210, true, Q8_K},
	Q8_K:   {"Q8_K", 256, 292, false, Q8_K},
}

// String returns ggml's name for the type, or "type(N)" for one this package does not know.
func (t Type) String() string {
	if t.Known() {
		return types[t].name
	}
	return fmt.Sprintf("type(%d)", uint32(t))
}

// Known reports whether the package knows the type's layout.
func (t Type) Known() bool { return int(t) < len(types) && types[t].blockSize > 0 }

// Weight reports whether the engine computes with weights of this type.
func (t Type) Weight() bool { return t.Known() && types[t].weight }

// BlockSize returns the number of elements in one block (1 for float types).
func (t Type) BlockSize() int { return types[t].blockSize }

// BlockBytes returns the size in bytes of one block.
func (t Type) BlockBytes() int { return types[t].blockBytes }

// DotType returns the type an activation row is quantized to before a dot product with a
// weight row of type t. This mirrors llama.cpp's CPU backend (vec_dot_type), which is what
// makes our numbers match its numbers on quantized models.
func (t Type) DotType() Type { return types[t].dot }

// RowBytes returns the bytes of a row of n elements, or an error when n is not a whole number
// of blocks or the type is unknown.
func (t Type) RowBytes(n int) (int, error) {
	if !t.Known() {
		return 0, fmt.Errorf("unknown ggml type %d", uint32(t))
	}
	ti := types[t]
	if n < 0 || n%ti.blockSize != 0 {
		return 0, fmt.Errorf("%s row of %d elements is not a whole number of %d-element blocks", ti.name, n, ti.blockSize)
	}
	return n / ti.blockSize * ti.blockBytes, nil
}

// Matrix is a row-major matrix of Rows rows of Cols values each, stored in Type's blocks.
// Quantization blocks run along a row, so each row is RowBytes(Cols) bytes.
type Matrix struct {
	Type       Type
	Rows, Cols int
	Data       []byte
}

// RowBytes returns the bytes of one row.
func (m Matrix) RowBytes() int { return m.Cols / types[m.Type].blockSize * types[m.Type].blockBytes }

// Row returns row r's bytes.
func (m Matrix) Row(r int) []byte {
	n := m.RowBytes()
	return m.Data[r*n : (r+1)*n : (r+1)*n]
}

// SubRows returns rows [from, to) as a matrix of their own.
func (m Matrix) SubRows(from, to int) Matrix {
	n := m.RowBytes()
	return Matrix{Type: m.Type, Rows: to - from, Cols: m.Cols, Data: m.Data[from*n : to*n : to*n]}
}
