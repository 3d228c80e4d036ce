package models

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ollama/ollama/fs/ggml"

	"github.com/commit-run/commit-run/quant"
)

// tinySpec is a 1-layer llama-with-experts model small enough to write in a test.
type tinySpec struct {
	kv      ggml.KV
	tensors []*ggml.Tensor
}

func f32Tensor(name string, shape ...uint64) *ggml.Tensor {
	n := uint64(1)
	for _, d := range shape {
		n *= d
	}
	buf := make([]byte, 4*n)
	for i := uint64(0); i < n; i++ {
		binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(float32(i%7)*0.01))
	}
	return &ggml.Tensor{Name: name, Kind: uint32(quant.F32), Shape: shape, WriterTo: bytes.NewReader(buf)}
}

func newTinySpec() *tinySpec {
	const embd, ff, vocab, experts = 32, 64, 16, 4
	s := &tinySpec{kv: ggml.KV{
		"general.architecture":                   "llama",
		"llama.block_count":                      uint32(1),
		"llama.embedding_length":                 uint32(embd),
		"llama.feed_forward_length":              uint32(ff),
		"llama.attention.head_count":             uint32(4),
		"llama.attention.head_count_kv":          uint32(2),
		"llama.attention.layer_norm_rms_epsilon": float32(1e-5),
		"llama.context_length":                   uint32(64),
		"llama.expert_count":                     uint32(experts),
		"llama.expert_used_count":                uint32(2),
	}}
	hd := uint64(embd / 4)
	s.tensors = []*ggml.Tensor{
		f32Tensor("token_embd.weight", embd, vocab),
		f32Tensor("output_norm.weight", embd),
		f32Tensor("blk.0.attn_norm.weight", embd),
		f32Tensor("blk.0.attn_q.weight", embd, embd),
		f32Tensor("blk.0.attn_k.weight", embd, 2*hd),
		f32Tensor("blk.0.attn_v.weight", embd, 2*hd),
		f32Tensor("blk.0.attn_output.weight", embd, embd),
		f32Tensor("blk.0.ffn_norm.weight", embd),
		f32Tensor("blk.0.ffn_gate_inp.weight", embd, experts),
		f32Tensor("blk.0.ffn_gate_exps.weight", embd, ff, experts),
		f32Tensor("blk.0.ffn_up_exps.weight", embd, ff, experts),
		f32Tensor("blk.0.ffn_down_exps.weight", ff, embd, experts),
	}
	return s
}

func (s *tinySpec) write(t testing.TB) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tiny.gguf")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := ggml.WriteGGUF(f, s.kv, s.tensors); err != nil {
		t.Fatal(err)
	}
	return path
}

func (s *tinySpec) replace(name string, t *ggml.Tensor) {
	for i, x := range s.tensors {
		if x.Name == name {
			s.tensors[i] = t
		}
	}
}

func openAndLoad(path string) (*Model, error) {
	f, err := Open(path)
	if err != nil {
		return nil, err
	}
	m, err := Load(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	return m, nil
}

func TestOpenTiny(t *testing.T) {
	m, err := openAndLoad(newTinySpec().write(t))
	if err != nil {
		t.Fatal(err)
	}
	defer m.File.Close()
	c := m.Config
	if c.Layers != 1 || c.Embd != 32 || c.Vocab != 16 || c.Experts != 4 || c.ExpertsUsed != 2 || c.ExpertFFN != 64 {
		t.Errorf("config = %+v", c)
	}
	if m.Layers[0].MoE == nil || m.Output != m.TokenEmbd {
		t.Errorf("want a MoE layer and a tied output")
	}
}

func TestBadFiles(t *testing.T) {
	good, err := os.ReadFile(newTinySpec().write(t))
	if err != nil {
		t.Fatal(err)
	}
	write := func(t *testing.T, b []byte) string {
		p := filepath.Join(t.TempDir(), "bad.gguf")
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	patchU64 := func(off int, v uint64) []byte {
		b := append([]byte(nil), good...)
		binary.LittleEndian.PutUint64(b[off:], v)
		return b
	}
	cases := []struct {
		name string
		path func(t *testing.T) string
		want string
	}{
		{"empty", func(t *testing.T) string { return write(t, nil) }, "truncated"},
		{"wrong magic", func(t *testing.T) string { return write(t, append([]byte("GGML"), good[4:]...)) }, "not a GGUF file"},
		{"truncated header", func(t *testing.T) string { return write(t, good[:100]) }, "truncated"},
		{"tensor data past the end", func(t *testing.T) string { return write(t, good[:len(good)-10]) }, "exceeds file size"},
		{"absurd tensor count", func(t *testing.T) string { return write(t, patchU64(8, 1<<40)) }, "tensors"},
		{"absurd key count", func(t *testing.T) string { return write(t, patchU64(16, 1<<40)) }, "metadata keys"},
		{"absurd string length", func(t *testing.T) string { return write(t, patchU64(24, 1<<62)) }, "string of"},
		{"directory", func(t *testing.T) string { return t.TempDir() }, "directory"},
		{"missing", func(t *testing.T) string { return filepath.Join(t.TempDir(), "nope.gguf") }, "no such file"},
		{"unknown architecture", func(t *testing.T) string {
			s := newTinySpec()
			s.kv["general.architecture"] = "mamba9"
			for k, v := range s.kv {
				if strings.HasPrefix(k, "llama.") {
					delete(s.kv, k)
					s.kv["mamba9."+strings.TrimPrefix(k, "llama.")] = v
				}
			}
			return s.write(t)
		}, "unknown architecture"},
		{"shape disagrees with metadata", func(t *testing.T) string {
			s := newTinySpec()
			s.replace("blk.0.attn_q.weight", f32Tensor("blk.0.attn_q.weight", 32, 24))
			return s.write(t)
		}, `"blk.0.attn_q.weight" has shape [32 24]`},
		{"missing tensor", func(t *testing.T) string {
			s := newTinySpec()
			s.tensors = s.tensors[:len(s.tensors)-1]
			return s.write(t)
		}, `"blk.0.ffn_down_exps.weight" is missing`},
		{"unsupported type", func(t *testing.T) string {
			s := newTinySpec()
			bad := f32Tensor("blk.0.attn_norm.weight", 32)
			bad.Kind = 16 // IQ2_XXS
			bad.WriterTo = bytes.NewReader(make([]byte, 66))
			s.replace("blk.0.attn_norm.weight", bad)
			return s.write(t)
		}, `"blk.0.attn_norm.weight" has type`},
		{"top-k larger than experts", func(t *testing.T) string {
			s := newTinySpec()
			s.kv["llama.expert_used_count"] = uint32(9)
			return s.write(t)
		}, "top-9 of 4"},
		{"heads do not divide", func(t *testing.T) string {
			s := newTinySpec()
			s.kv["llama.attention.head_count_kv"] = uint32(3)
			return s.write(t)
		}, "cannot share"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m, err := openAndLoad(tc.path(t))
			if err == nil {
				m.File.Close()
				t.Fatalf("no error, want one containing %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not contain %q", err, tc.want)
			}
			if tc.name == "unknown architecture" && !errors.Is(err, ErrUnknownArchitecture) {
				t.Errorf("error does not wrap ErrUnknownArchitecture")
			}
		})
	}
}

// FuzzOpen feeds arbitrary bytes to the loader: it must return an error or a model, never
// panic, hang or allocate without bound.
func FuzzOpen(f *testing.F) {
	dir := f.TempDir()
	good := newTinySpec().write(f)
	b, err := os.ReadFile(good)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Add(b[:64])
	glm, err := os.ReadFile(newTinyGLM().write(f))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(glm)
	f.Add([]byte("GGUF"))
	f.Fuzz(func(t *testing.T, data []byte) {
		p := filepath.Join(dir, "fuzz.gguf")
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		m, err := openAndLoad(p)
		if err == nil {
			m.File.Close()
		}
	})
}

// badFile is a malformed variant of a tiny file: change makes it from a good one, and the
// load error must contain want (name defaults to want).
type badFile struct {
	name   string
	change func(s *tinySpec)
	want   string
}

// checkBadFiles loads each variant of fresh() and requires an error containing its want.
func checkBadFiles(t *testing.T, fresh func() *tinySpec, cases []badFile) {
	t.Helper()
	for _, tc := range cases {
		t.Run(cmp.Or(tc.name, tc.want), func(t *testing.T) {
			s := fresh()
			tc.change(s)
			m, err := openAndLoad(s.write(t))
			if err == nil {
				m.File.Close()
				t.Fatalf("no error, want one containing %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not contain %q", err, tc.want)
			}
		})
	}
}
