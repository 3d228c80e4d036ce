package cpu

import (
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/quant"
)

// MeasureHostRates times this machine's CPU device on a Q4_K 4096x4096 product, the work of
// an expert computed on the host: for one token, the weight bytes it reads per second from
// memory, and from 16 tokens, the flops per second of each token after the first.
//
// The host's experts come from a store of gigabytes, so the read rate is timed on weights in
// memory. A 9.4 MB matrix read again and again stays in the last-level cache, and priced at
// the cache's rate the host's experts look about twice as fast as they are: on a 2-core
// machine 21-36 GB/s, where an OLMoE-shaped decode read its weights at 15 GB/s. On the lent
// H200's 16-core host, cpu-miss decoded at 0.63x ondemand and took twice the time its
// simulation charged, with the host's rate measured so (79 GB/s) above a copy's over PCIe
// (50 GB/s): the likeliest cause. So the matrix is copied through a buffer of several times
// the cache (coldCopies), and each timed product reads one of the first copies, which the
// later ones evicted. The arithmetic is timed on the matrix in the caches, where no read
// hides it.
func MeasureHostRates() device.HostRates {
	w := hostBenchMatrix(4096, 4096)
	d := New(0)
	const T = 16
	x, out := make([]float32, T*w.Cols), make([]float32, T*w.Rows)
	times := func(T, n int, data func(i int) []byte) []float64 {
		ts := make([]float64, n)
		for i := range ts {
			m := w
			m.Data = data(i)
			start := time.Now()
			d.MatMulID(m, x[:T*w.Cols], T, out[:T*w.Rows])
			ts[i] = max(time.Since(start).Seconds(), 1e-9)
		}
		slices.Sort(ts)
		return ts
	}
	// The arithmetic from the caches, where no read hides it: the best of three.
	warm := func(int) []byte { return w.Data }
	one, many := times(1, 3, warm)[0], times(T, 3, warm)[0]
	// The reads from memory: the median of 16 copies, as a product that reads memory varies
	// from one to the next as the host's experts do (on a 2-core machine the best of them
	// was 1.3x the median, and an OLMoE-shaped decode read its weights at the median's rate).
	copies := coldCopies(w.Data, evictionBytes(cacheDir))
	cold := times(1, min(len(copies), 16), func(i int) []byte { return copies[i] })
	read := cold[len(cold)/2]
	copies = nil
	debug.FreeOSMemory() // the buffer is up to 256 MiB: give it back before the model loads
	// 16 tokens cannot take less than one, whatever the noise: at worst price the further
	// tokens as if each cost a hundredth of the first.
	further := max(many-one, (T-1)*one/100)
	return device.HostRates{Bandwidth: float64(len(w.Data)) / max(read, one), FLOPS: 2 * float64(w.Rows) * float64(w.Cols) * (T - 1) / further}
}

// cacheDir is where Linux describes the first CPU's caches.
const cacheDir = "/sys/devices/system/cpu/cpu0/cache"

// Bounds of evictionBytes: the least that evicts a desktop's cache where none is described,
// and the most a measurement takes from the host's memory for a moment (a quarter of a
// second of start-up on a 2-core machine). A cache over half of that, a server's, is
// evicted only in part.
const (
	minEviction = 64 << 20
	maxEviction = 256 << 20
)

// evictionBytes is how much memory to stream through so that the first of it has left the
// caches: four times the largest cache dir describes (largestCache), within minEviction and
// maxEviction.
func evictionBytes(dir string) int {
	return min(max(4*int(largestCache(dir)), minEviction), maxEviction)
}

// LargestCache is the size in bytes of this machine's largest CPU cache as Linux describes
// it, 0 where it does not.
func LargestCache() int64 { return largestCache(cacheDir) }

// largestCache reads the largest of the caches dir describes (its index*/size files, as
// "32768K"), 0 if none.
func largestCache(dir string) int64 {
	var largest int64
	files, _ := filepath.Glob(filepath.Join(dir, "index*", "size"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		s, mul := strings.TrimSpace(string(b)), int64(1)
		switch {
		case strings.HasSuffix(s, "K"):
			s, mul = strings.TrimSuffix(s, "K"), 1<<10
		case strings.HasSuffix(s, "M"):
			s, mul = strings.TrimSuffix(s, "M"), 1<<20
		}
		if n, err := strconv.ParseInt(s, 10, 64); err == nil && n > 0 {
			largest = max(largest, n*mul)
		}
	}
	return largest
}

// coldCopies copies data over and over through one buffer of about total bytes, and returns
// the copies oldest first: once the buffer is written, the first copies are the ones the
// caches gave up.
func coldCopies(data []byte, total int) [][]byte {
	k := max(total/len(data), 1)
	buf := make([]byte, k*len(data))
	copies := make([][]byte, k)
	for i := range copies {
		copies[i] = buf[i*len(data) : (i+1)*len(data) : (i+1)*len(data)]
		copy(copies[i], data)
	}
	return copies
}

// hostBenchMatrix is a Q4_K matrix of fixed, varied values (cols a multiple of 256) for
// timing the host's products.
func hostBenchMatrix(rows, cols int) quant.Matrix {
	rb, _ := quant.Q4_K.RowBytes(cols)
	w := quant.Matrix{Type: quant.Q4_K, Rows: rows, Cols: cols, Data: make([]byte, rows*rb)}
	src := make([]float32, cols)
	for r := 0; r < rows; r++ {
		for i := range src {
			src[i] = float32((r*31+i*17)%97-48) / 97
		}
		quant.QuantizeRow(quant.Q4_K, src, w.Data[r*rb:(r+1)*rb])
	}
	return w
}
