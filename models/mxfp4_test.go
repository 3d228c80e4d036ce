package models

import (
	"bytes"
	"strings"
	"testing"

	"github.com/ollama/ollama/fs/ggml"

	"github.com/commit-run/commit-run/quant"
)

// mxfp4Tensor is a tensor of ggml type 39 (gpt-oss's expert type) whose blocks have the scale
// byte 127 (2^-1 for the doubled codebook) and quant bytes counting up.
func mxfp4Tensor(name string, shape ...uint64) *ggml.Tensor {
	n := uint64(1)
	for _, d := range shape {
		n *= d
	}
	buf := make([]byte, n/32*17)
	for i := range buf {
		if i%17 == 0 {
			buf[i] = 127
		} else {
			buf[i] = byte(i % 251)
		}
	}
	return &ggml.Tensor{Name: name, Kind: uint32(quant.MXFP4), Shape: shape, WriterTo: bytes.NewReader(buf)}
}

func TestOpenMXFP4(t *testing.T) {
	s := newTinySpec()
	for _, name := range []string{"blk.0.ffn_gate_exps.weight", "blk.0.ffn_up_exps.weight"} {
		s.replace(name, mxfp4Tensor(name, 32, 64, 4))
	}
	s.replace("blk.0.ffn_down_exps.weight", mxfp4Tensor("blk.0.ffn_down_exps.weight", 64, 32, 4))
	m, err := openAndLoad(s.write(t))
	if err != nil {
		t.Fatal(err)
	}
	defer m.File.Close()
	for _, tc := range []struct {
		name string
		ne0  int
	}{{"blk.0.ffn_gate_exps.weight", 32}, {"blk.0.ffn_up_exps.weight", 32}, {"blk.0.ffn_down_exps.weight", 64}} {
		tn := m.File.Tensor(tc.name)
		if tn == nil || tn.Type != quant.MXFP4 {
			t.Fatalf("%s: %+v, want an MXFP4 tensor", tc.name, tn)
		}
		if want := tc.ne0 / 32 * 17 * (64 * 32 * 4 / tc.ne0); len(tn.Data) != want {
			t.Errorf("%s: %d bytes of data, want %d", tc.name, len(tn.Data), want)
		}
		// The first block as the file holds it: scale 2^-1, quants 1..16 of the pattern.
		got := make([]float32, 32)
		quant.DequantizeRow(quant.MXFP4, tn.Data[:17], got)
		if got[0] != 0.5 || got[16] != 0 || got[1] != 1 || got[17] != 0 {
			t.Errorf("%s: first block decodes to %v", tc.name, got)
		}
	}
}

func TestOpenMXFP4BadRow(t *testing.T) {
	s := newTinySpec()
	bad := mxfp4Tensor("blk.0.attn_norm.weight", 32)
	bad.Shape = []uint64{48} // not a whole number of 32-element blocks
	s.replace("blk.0.attn_norm.weight", bad)
	_, err := openAndLoad(s.write(t))
	if err == nil || !strings.Contains(err.Error(), `"blk.0.attn_norm.weight": MXFP4 row of 48 elements is not a whole number of 32-element blocks`) {
		t.Fatalf("error %v, want one naming the tensor and its partial MXFP4 block", err)
	}
}
