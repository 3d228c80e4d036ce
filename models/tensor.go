package models

import (
	"fmt"

	"github.com/commit-run/commit-run/quant"
)

// Tensor is one weight of a GGUF file. Ne is ggml's shape order: Ne[0] is the contiguous
// dimension (the length of a row), so a 2-D weight {n_in, n_out} is n_out rows of n_in values
// and a 3-D expert tensor {n_in, n_out, n_expert} holds each expert as one contiguous matrix.
type Tensor struct {
	Name string
	Type quant.Type
	Ne   []int
	// Data is the tensor's bytes inside the file's memory map.
	Data       []byte
	start, end int
}

// Elements returns the number of values in the tensor.
func (t *Tensor) Elements() int64 {
	n := int64(1)
	for _, d := range t.Ne {
		n *= int64(d)
	}
	return n
}

// Bytes returns the size of the tensor's data.
func (t *Tensor) Bytes() int64 { return int64(t.end - t.start) }

// Matrix views a 2-D tensor (or a 1-D one as a single row) as rows of Ne[0] values.
func (t *Tensor) Matrix() quant.Matrix {
	rows := 1
	for _, d := range t.Ne[1:] {
		rows *= d
	}
	return quant.Matrix{Type: t.Type, Rows: rows, Cols: t.Ne[0], Data: t.Data}
}

// Experts returns the number of matrices in a 3-D expert tensor.
func (t *Tensor) Experts() int {
	if len(t.Ne) < 3 {
		return 1
	}
	return t.Ne[2]
}

// Expert views expert e of a 3-D tensor {cols, rows, n_expert} as a matrix.
func (t *Tensor) Expert(e int) quant.Matrix {
	m := quant.Matrix{Type: t.Type, Rows: t.Ne[1], Cols: t.Ne[0]}
	size := len(t.Data) / t.Experts()
	m.Data = t.Data[e*size : (e+1)*size : (e+1)*size]
	return m
}

// Float32s decodes the whole tensor to float32; used for the small vectors (norms, biases)
// that the models keep in memory as plain floats.
func (t *Tensor) Float32s() []float32 {
	out := make([]float32, t.Elements())
	quant.DequantizeRow(t.Type, t.Data, out)
	return out
}

// checkShape reports whether t has exactly the given shape; trailing 1s are ignored, as
// ggml ignores them.
func (t *Tensor) checkShape(want ...int) error {
	got := t.Ne
	for len(got) > 1 && got[len(got)-1] == 1 {
		got = got[:len(got)-1]
	}
	for len(want) > 1 && want[len(want)-1] == 1 {
		want = want[:len(want)-1]
	}
	ok := len(got) == len(want)
	for i := 0; ok && i < len(got); i++ {
		ok = got[i] == want[i]
	}
	if !ok {
		return fmt.Errorf("tensor %q has shape %v, the metadata implies %v", t.Name, t.Ne, want)
	}
	return nil
}
