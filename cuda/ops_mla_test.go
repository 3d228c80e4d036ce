package cuda

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"unsafe"

	"github.com/commit-run/commit-run/cpu"
	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/models"
	"github.com/commit-run/commit-run/quant"
)

// deviceFloats returns n floats of device memory holding v's values (v nil: zeros).
func deviceFloats(t *testing.T, g *GPU, n int, v []float32) []float32 {
	t.Helper()
	b, err := g.Buffer(int64(4*n), "test")
	if err != nil {
		t.Fatal(err)
	}
	d := unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), n)
	if v == nil {
		v = make([]float32, n)
	}
	g.Write(d, v)
	return d
}

// hostFloats reads device floats back.
func hostFloats(g *GPU, d []float32) []float32 {
	h := make([]float32, len(d))
	g.Read(h, d)
	return h
}

// TestGPUMLAOps checks the GPU's Ops for MLA against HostOps, the CPU reference: the strided
// copies and norm to the bit, the per-head products within float32 rounding of the exact
// products (and of HostOps' for F32 weights; on quantized ones the CPU rounds activations to
// the weights' dot type, the GPU does not), in one launch for the heads of one tensor and one
// per head otherwise.
func TestGPUMLAOps(t *testing.T) {
	g := openFakeGPU(t, GPUOptions{})
	host := models.HostOps{K: cpu.New(2)}
	r := rand.New(rand.NewPCG(3, 4))

	// Copy2D: strided rows, and one row repeated (a zero source stride), into rows whose
	// other floats must stay.
	src := randF32(r, 64, 1)
	dst := randF32(r, 80, 1)
	want := append([]float32(nil), dst...)
	host.Copy2D(want, src[3:], 5, 7, 11, 9)
	host.Copy2D(want[60:], src[50:], 3, 5, 6, 0)
	dsrc, ddst := deviceFloats(t, g, len(src), src), deviceFloats(t, g, len(dst), dst)
	g.Copy2D(ddst, dsrc[3:], 5, 7, 11, 9)
	g.Copy2D(ddst[60:], dsrc[50:], 3, 5, 6, 0)
	checkBits(t, "Copy2D", hostFloats(g, ddst), want)

	// RMSNormStrided: the first 48 of each 64 values normalised in place, then into another
	// buffer; values on the exact grid, so that the float64 sum's order cannot matter.
	x := exactGrid(r, 3*64)
	w := randF32(r, 48, 1)
	want = append([]float32(nil), x...)
	host.RMSNormStrided(want, want, 3, 48, 64, 64, w, nil, 1e-6)
	dx, dw := deviceFloats(t, g, len(x), x), deviceFloats(t, g, len(w), w)
	g.RMSNormStrided(dx, dx, 3, 48, 64, 64, dw, nil, 1e-6)
	checkBits(t, "RMSNormStrided in place", hostFloats(g, dx), want)
	out := make([]float32, 2*50)
	host.RMSNormStrided(out, want, 2, 48, 50, 64, nil, nil, 1e-5)
	dout := deviceFloats(t, g, len(out), nil)
	g.RMSNormStrided(dout, dx, 2, 48, 50, 64, nil, nil, 1e-5)
	checkBits(t, "RMSNormStrided", hostFloats(g, dout), out)

	// MatMulHeads: 3 heads of 24x64 over 5 tokens whose rows hold every head with room
	// around them, as MLA's k_b reads q_nope out of q.
	const H, rows, cols, T = 3, 24, 64, 5
	l := &device.HeadLayout{XHead: cols + 16, XTok: H*(cols+16) + 8, OutHead: rows + 8, OutTok: H*(rows+8) + 4}
	xs := randF32(r, T*l.XTok, 1)
	dxs := deviceFloats(t, g, len(xs), xs)
	for _, typ := range []quant.Type{quant.F32, quant.Q8_0} {
		tensor := randMatrix(t, typ, H*rows, cols, r)
		if err := g.Upload(tensor.Data, "a tensor"); err != nil {
			t.Fatal(err)
		}
		rb := tensor.RowBytes()
		heads := make([]quant.Matrix, H)
		apart := make([]quant.Matrix, H) // uploaded one by one, of growing sizes: not evenly spaced
		for h := range heads {
			heads[h] = quant.Matrix{Type: typ, Rows: rows, Cols: cols, Data: tensor.Data[h*rows*rb : (h+1)*rows*rb]}
			buf := make([]byte, len(heads[h].Data)+4096*h)
			copy(buf, heads[h].Data)
			if err := g.Upload(buf, "a head"); err != nil {
				t.Fatal(err)
			}
			apart[h] = quant.Matrix{Type: typ, Rows: rows, Cols: cols, Data: buf[:len(heads[h].Data)]}
		}
		exact := make([]float32, T*l.OutTok)
		for h, m := range heads {
			xh, yh := make([]float32, T*cols), make([]float32, T*rows)
			for tk := 0; tk < T; tk++ {
				copy(xh[tk*cols:], xs[tk*l.XTok+h*l.XHead:][:cols])
			}
			exactProduct(m, xh, T, yh)
			for tk := 0; tk < T; tk++ {
				copy(exact[tk*l.OutTok+h*l.OutHead:], yh[tk*rows:(tk+1)*rows])
			}
		}
		ref := make([]float32, T*l.OutTok)
		host.MatMulHeads(heads, xs, T, ref, l)
		for _, c := range []struct {
			name     string
			w        []quant.Matrix
			launches int64
		}{{"one tensor", heads, 1}, {"apart", apart, H}} {
			dy := deviceFloats(t, g, T*l.OutTok, nil)
			before := g.Stats().Launches
			g.MatMulHeads(c.w, dxs, T, dy, l)
			got := hostFloats(g, dy)
			if n := g.Stats().Launches - before; n != c.launches {
				t.Errorf("%s %s: %d launches, want %d", typ, c.name, n, c.launches)
			}
			for i := range got {
				if d := math.Abs(float64(got[i] - exact[i])); d > 1e-5*(1+math.Abs(float64(exact[i]))) {
					t.Fatalf("%s %s: out[%d] = %v, exactly %v", typ, c.name, i, got[i], exact[i])
				}
				// The CPU's F32 products are float32's too (its Q8_0 ones round x to 8 bits
				// first, far from the exact product).
				if d := math.Abs(float64(got[i] - ref[i])); typ == quant.F32 && d > 1e-5*(1+math.Abs(float64(ref[i]))) {
					t.Fatalf("%s %s: out[%d] = %v, HostOps %v", typ, c.name, i, got[i], ref[i])
				}
			}
		}
	}
	if err := g.Err(); err != nil {
		t.Fatal(err)
	}
}

// TestGPUMLAOpsErrors checks that the MLA Ops refuse bad operands with the GPU's sticky
// error, touching nothing.
func TestGPUMLAOpsErrors(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	w := randMatrix(t, quant.F32, 8, 32, r)
	other := randMatrix(t, quant.F32, 3, 32, r)
	l := &device.HeadLayout{XHead: 32, XTok: 64, OutHead: 4, OutTok: 8}
	cases := []struct {
		name string
		run  func(g *GPU, x, y []float32, ws []quant.Matrix)
		want string
	}{
		{"short input", func(g *GPU, x, y []float32, ws []quant.Matrix) { g.MatMulHeads(ws, x[:100], 2, y, l) }, "2 tokens of 2 heads"},
		{"heads of two shapes", func(g *GPU, x, y []float32, ws []quant.Matrix) {
			g.MatMulHeads([]quant.Matrix{ws[0], other}, x, 2, y, l)
		}, "head 1's weights are F32 3x32"},
		{"host input", func(g *GPU, x, y []float32, ws []quant.Matrix) {
			g.MatMulHeads(ws, make([]float32, len(x)), 2, y, l)
		}, "the input"},
		{"weights not on the device", func(g *GPU, x, y []float32, ws []quant.Matrix) {
			g.MatMulHeads([]quant.Matrix{other, other}, x, 1, y, l)
		}, "the weights"},
		{"copy past the end", func(g *GPU, x, y []float32, ws []quant.Matrix) { g.Copy2D(y, x, 3, 4, 7, 0) }, "3 rows of 4 values"},
		{"norm past the end", func(g *GPU, x, y []float32, ws []quant.Matrix) {
			g.RMSNormStrided(y, x, 2, 10, 10, 8, nil, nil, 1e-6)
		}, "2 rows of 10 values"},
	}
	for _, c := range cases {
		g := openFakeGPU(t, GPUOptions{})
		if err := g.Upload(w.Data, "k_b"); err != nil {
			t.Fatal(err)
		}
		heads := []quant.Matrix{
			{Type: quant.F32, Rows: 4, Cols: 32, Data: w.Data[:4*128]},
			{Type: quant.F32, Rows: 4, Cols: 32, Data: w.Data[4*128:]},
		}
		x, y := deviceFloats(t, g, 128, randF32(r, 128, 1)), deviceFloats(t, g, 16, nil)
		c.run(g, x, y, heads)
		if err := g.Err(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.name, err, c.want)
		}
		if got := hostFloats(g, y); got[0] != 0 || got[15] != 0 {
			t.Errorf("%s: the output was written: %v", c.name, got)
		}
	}
}
