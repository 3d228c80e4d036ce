package tinymoe

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"sort"
)

// Weights are the F32 tensors of a safetensors file, by name, with PyTorch shapes
// (outermost dimension first).
type Weights struct {
	Shapes   map[string][]int
	Data     map[string][]float32
	Metadata map[string]string
}

// Names returns the tensor names in order.
func (w *Weights) Names() []string {
	names := make([]string, 0, len(w.Data))
	for n := range w.Data {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// ReadSafetensors reads a safetensors file of F32 tensors (what train.py writes).
func ReadSafetensors(path string) (*Weights, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read weights: %w", err)
	}
	return parseSafetensors(b, path)
}

func parseSafetensors(b []byte, path string) (*Weights, error) {
	fail := func(format string, args ...any) (*Weights, error) {
		return nil, fmt.Errorf("read weights %s: %s", path, fmt.Sprintf(format, args...))
	}
	if len(b) < 8 {
		return fail("file of %d bytes has no header", len(b))
	}
	hlen := binary.LittleEndian.Uint64(b)
	if hlen > uint64(len(b)-8) {
		return fail("header length %d exceeds the file", hlen)
	}
	var hdr map[string]json.RawMessage
	if err := json.Unmarshal(b[8:8+hlen], &hdr); err != nil {
		return fail("header: %v", err)
	}
	data := b[8+hlen:]
	w := &Weights{Shapes: map[string][]int{}, Data: map[string][]float32{}}
	for name, raw := range hdr {
		if name == "__metadata__" {
			if err := json.Unmarshal(raw, &w.Metadata); err != nil {
				return fail("metadata: %v", err)
			}
			continue
		}
		var t struct {
			DType   string   `json:"dtype"`
			Shape   []int    `json:"shape"`
			Offsets []uint64 `json:"data_offsets"`
		}
		if err := json.Unmarshal(raw, &t); err != nil {
			return fail("tensor %s: %v", name, err)
		}
		if t.DType != "F32" {
			return fail("tensor %s has dtype %s; only F32 is read", name, t.DType)
		}
		n := uint64(1)
		for _, d := range t.Shape {
			if d <= 0 || d > 1<<31 {
				return fail("tensor %s has dimension %d", name, d)
			}
			n *= uint64(d)
		}
		if len(t.Offsets) != 2 || t.Offsets[0] > t.Offsets[1] || t.Offsets[1] > uint64(len(data)) || t.Offsets[1]-t.Offsets[0] != 4*n {
			return fail("tensor %s: offsets %v do not hold %d float32 values in %d bytes of data", name, t.Offsets, n, len(data))
		}
		raw := data[t.Offsets[0]:t.Offsets[1]]
		v := make([]float32, n)
		for i := range v {
			v[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
		}
		w.Shapes[name] = t.Shape
		w.Data[name] = v
	}
	return w, nil
}
