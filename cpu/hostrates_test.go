package cpu

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkHostMatMulBatch times the host's product of an expert-sized Q4_K matrix at several
// batch sizes: how a host kernel's cost grows with its tokens, which device.HostRates model as
// the weights read once plus each further token's arithmetic (MeasureHostRates measures both).
// The warm products read one matrix again and again, from the caches once it fits them; the
// cold ones a copy of it that the copies after it evicted (coldCopies), as the host reads an
// expert from its store: their ratio is what the caches lend a measurement.
func BenchmarkHostMatMulBatch(b *testing.B) {
	w := hostBenchMatrix(2048, 4096)
	d := New(0)
	var copies [][]byte
	for _, temp := range []string{"warm", "cold"} {
		for _, T := range []int{1, 2, 4, 8, 16, 32} {
			b.Run(fmt.Sprintf("%s/T=%d", temp, T), func(b *testing.B) {
				if temp == "cold" && copies == nil {
					copies = coldCopies(w.Data, evictionBytes(cacheDir))
				}
				x, out := make([]float32, T*w.Cols), make([]float32, T*w.Rows)
				m, i := w, 0
				for b.Loop() {
					if copies != nil {
						m.Data = copies[i%len(copies)]
						i++
					}
					d.MatMulID(m, x, T, out)
				}
				s := b.Elapsed().Seconds() / float64(b.N)
				b.ReportMetric(s*1e3, "ms/product")
				b.ReportMetric(float64(len(w.Data))/s/1e9, "GB/s")
			})
		}
	}
}

// evictionBytes takes four times the largest cache Linux describes, within its bounds;
// coldCopies returns copies of the data, oldest first, filling about the bytes asked.
func TestEvictionBytes(t *testing.T) {
	for _, c := range []struct {
		sizes []string // index0, index1, ...
		want  int
	}{
		{nil, minEviction},
		{[]string{"48K", "64K", "2048K", "32768K"}, 128 << 20},
		{[]string{"32K", "1M", "48M"}, 192 << 20},
		{[]string{"48K", "2048K", "491520K"}, maxEviction},
		{[]string{"32K", "512K", "4M"}, minEviction},
		{[]string{"lots", "", "-5K", "24M\n"}, 96 << 20},
	} {
		dir := t.TempDir()
		for i, s := range c.sizes {
			sub := filepath.Join(dir, fmt.Sprintf("index%d", i))
			if err := os.Mkdir(sub, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(sub, "size"), []byte(s), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if got := evictionBytes(dir); got != c.want {
			t.Errorf("caches %q: %d bytes, want %d", c.sizes, got, c.want)
		}
	}
	data := []byte{1, 2, 3}
	copies := coldCopies(data, 10)
	if len(copies) != 3 || string(copies[2]) != string(data) || &copies[0][0] == &data[0] || cap(copies[0]) != len(data) {
		t.Errorf("coldCopies of 3 bytes in 10: %v", copies)
	}
}

// MeasureHostRates gives rates the GPU planners accept, whatever this machine's speed.
func TestMeasureHostRates(t *testing.T) {
	r := MeasureHostRates()
	if !(r.Bandwidth > 0) || !(r.FLOPS > 0) || math.IsInf(r.Bandwidth, 0) || math.IsInf(r.FLOPS, 0) || r.Overhead != 0 {
		t.Fatalf("measured %+v: want positive, finite rates and the default overhead", r)
	}
	if _, err := r.WithDefaults(); err != nil {
		t.Error(err)
	}
	t.Logf("%.1f GB/s for one token, %.0f GFLOP/s for each further token", r.Bandwidth/1e9, r.FLOPS/1e9)
}
