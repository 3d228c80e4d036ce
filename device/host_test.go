package device

import (
	"math"
	"strings"
	"testing"

	"github.com/commit-run/commit-run/quant"
)

func TestHostRatesWithDefaults(t *testing.T) {
	cases := []struct {
		name string
		in   HostRates
		want HostRates
		err  string
	}{
		{"zero: the defaults", HostRates{}, HostRates{DefaultHostBandwidth, DefaultHostFLOPS, DefaultHostOverhead, DefaultHostBandwidth}, ""},
		{"given rates kept", HostRates{1e9, 2e9, 3e-6, 4e9}, HostRates{1e9, 2e9, 3e-6, 4e9}, ""},
		{"memory defaults to the kernels' rate", HostRates{Bandwidth: 1e9}, HostRates{1e9, DefaultHostFLOPS, DefaultHostOverhead, 1e9}, ""},
		{"one given", HostRates{FLOPS: 5e10}, HostRates{DefaultHostBandwidth, 5e10, DefaultHostOverhead, DefaultHostBandwidth}, ""},
		{"negative bandwidth", HostRates{Bandwidth: -1}, HostRates{}, "host bandwidth"},
		{"NaN flops", HostRates{FLOPS: math.NaN()}, HostRates{}, "host flops"},
		{"infinite overhead", HostRates{Overhead: math.Inf(1)}, HostRates{}, "host overhead"},
		{"negative memory", HostRates{Memory: -2}, HostRates{}, "host memory bandwidth"},
	}
	for _, c := range cases {
		got, err := c.in.WithDefaults()
		switch {
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%s: %v, want an error mentioning %q", c.name, err, c.err)
		case c.err == "" && (err != nil || got != c.want):
			t.Errorf("%s: %+v, %v; want %+v", c.name, got, err, c.want)
		}
	}
}

// A product's work is its weights once and the arithmetic of the tokens after the first;
// the rates price each part.
func TestHostWork(t *testing.T) {
	m := quant.Matrix{Type: quant.F32, Rows: 3, Cols: 5, Data: make([]byte, 60)}
	cases := []struct {
		tokens int
		flops  float64
	}{{0, 0}, {1, 0}, {2, 30}, {9, 240}}
	for _, c := range cases {
		w := HostWork{}.Plus(m, c.tokens)
		if w != (HostWork{Bytes: 60, FLOPs: c.flops, Kernels: 1}) {
			t.Errorf("%d tokens: %+v, want 60 bytes, %v flops, 1 kernel", c.tokens, w, c.flops)
		}
	}
	w := HostWork{}.Plus(m, 2).Add(HostWork{}.Plus(m, 3))
	if w != (HostWork{Bytes: 120, FLOPs: 90, Kernels: 2}) {
		t.Errorf("sum %+v", w)
	}
	r := HostRates{Bandwidth: 60, FLOPS: 30, Overhead: 0.5}
	if got := r.Seconds(w); got != 2+3+1 {
		t.Errorf("%+v at %+v: %v s, want 6", w, r, got)
	}
}
