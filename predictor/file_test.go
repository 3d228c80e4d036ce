package predictor

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ollama/ollama/fs/ggml"
)

const fp1 = "1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f809"

// savedRouter is a small trained-looking router with a full training record.
func savedRouter(t testing.TB) *Router {
	t.Helper()
	id := testIdentity(3, 6, 2, 5)
	id.Model, id.Arch, id.Fingerprint = "tinymoe-mixtral", "llama", fp1
	r, err := NewRouter(id, nil, 17)
	if err != nil {
		t.Fatal(err)
	}
	r.Info = TrainInfo{Source: "war-and-peace.txt", Created: "2025-11-22T10:00:00Z", Tokens: 1234, LR: 5e-5, StepEpochs: 5,
		Gamma: 0.5, MaxEpochs: 100, Patience: 10, MinDelta: 1e-4, Batch: 32, ValFraction: 0.2, Seed: 42,
		Nets: []NetInfo{
			{Init: "warm", TrainSamples: 987, ValSamples: 247, Epochs: 31, BestEpoch: 21, TrainLoss: 0.25, ValLoss: 0.5, ValAccuracy: 0.75},
			{Init: "warm", TrainSamples: 987, ValSamples: 247, Epochs: 12, BestEpoch: 2, TrainLoss: 0.125, ValLoss: 0.375, ValAccuracy: 0.875},
			{Init: "random", TrainSamples: 900, ValSamples: 230, Epochs: 40, BestEpoch: 30, TrainLoss: 1, ValLoss: 1.5, ValAccuracy: 0.5},
		}}
	return r
}

func sameRouter(t *testing.T, got, want *Router) {
	t.Helper()
	if err := got.ID.Check(want.ID); err != nil || got.ID.Model != want.ID.Model {
		t.Errorf("identity %+v, want %+v (%v)", got.ID, want.ID, err)
	}
	if len(got.Nets) != len(want.Nets) {
		t.Fatalf("%d nets, want %d", len(got.Nets), len(want.Nets))
	}
	for j := range got.Nets {
		a, b := got.Nets[j], want.Nets[j]
		if a.In != b.In || a.Hidden != b.Hidden || a.Out != b.Out {
			t.Errorf("net %d: shape %d/%d/%d, want %d/%d/%d", j, a.In, a.Hidden, a.Out, b.In, b.Hidden, b.Out)
		}
		for i, p := range [][2][]float32{{a.W1, b.W1}, {a.B1, b.B1}, {a.W2, b.W2}, {a.B2, b.B2}} {
			if !slices.Equal(p[0], p[1]) {
				t.Errorf("net %d tensor %d differs", j, i)
			}
		}
	}
}

func TestSaveLoadRoundTrip(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "m.commit-router.gguf")
	r := savedRouter(t)
	if err := Save(path, r); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path + ".tmp"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("temporary file left behind: %v", err)
	}
	got, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	sameRouter(t, got, r)
	// Every value of the training record here is exact in f32.
	if !reflectEqual(got.Info, r.Info) {
		t.Errorf("info\n%+v\nwant\n%+v", got.Info, r.Info)
	}
	// Saving what was loaded gives the same bytes.
	path2 := filepath.Join(dir, "again.gguf")
	if err := Save(path2, got); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(path)
	b, _ := os.ReadFile(path2)
	if !bytes.Equal(a, b) {
		t.Error("save(load(save(r))) differs from save(r)")
	}

	// An untrained router (no record) with a linear last net also round-trips.
	u := &Router{ID: testIdentity(1, 3, 1, 2), Nets: []*Net{{In: 2, Out: 3, W1: []float32{1, 2, 3, 4, 5, 6}, B1: []float32{-1, 0, 1}}}}
	if err := Save(path, u); err != nil {
		t.Fatal(err)
	}
	got, err = Load(path)
	if err != nil {
		t.Fatal(err)
	}
	sameRouter(t, got, u)
	if got.Info.Nets != nil {
		t.Errorf("untrained router got a record %+v", got.Info)
	}
}

func reflectEqual(a, b TrainInfo) bool {
	return a.Source == b.Source && a.Created == b.Created && a.Tokens == b.Tokens && a.LR == b.LR &&
		a.StepEpochs == b.StepEpochs && a.Gamma == b.Gamma && a.MaxEpochs == b.MaxEpochs && a.Patience == b.Patience && a.MinDelta == b.MinDelta &&
		a.Batch == b.Batch && a.ValFraction == b.ValFraction && a.Seed == b.Seed && slices.Equal(a.Nets, b.Nets)
}

func TestSaveRefusesBadRouter(t *testing.T) {
	path := filepath.Join(t.TempDir(), "r.gguf")
	r := savedRouter(t)
	r.Nets[1].W1[3] = float32(math.Inf(1))
	if err := Save(path, r); err == nil || !strings.Contains(err.Error(), "net 1") {
		t.Errorf("infinite weight: %v", err)
	}
	r = savedRouter(t)
	r.Nets = r.Nets[:2]
	if err := Save(path, r); err == nil {
		t.Error("missing net: no error")
	}
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Error("a refused router left a file")
	}
}

// writeGGUF writes kv and F32 tensors as GGUF, for files Save would never write.
func writeGGUF(t *testing.T, path string, kv ggml.KV, tensors map[string][]int) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var ts []*ggml.Tensor
	for name, shape := range tensors {
		n := 1
		sh := make([]uint64, len(shape))
		for i, d := range shape {
			n *= d
			sh[i] = uint64(d)
		}
		ts = append(ts, &ggml.Tensor{Name: name, Kind: uint32(ggml.TensorTypeF32), Shape: sh, WriterTo: bytes.NewReader(make([]byte, 4*n))})
	}
	if err := ggml.WriteGGUF(f, kv, ts); err != nil {
		t.Fatal(err)
	}
}

func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.gguf")
	r := savedRouter(t)
	if err := Save(good, r); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	kv, ts := r.encode()
	shapes := map[string][]int{}
	for _, tn := range ts {
		var s []int
		for _, d := range tn.Shape {
			s = append(s, int(d))
		}
		shapes[tn.Name] = s
	}
	variant := func(name string, edit func(kv ggml.KV, shapes map[string][]int)) string {
		k := ggml.KV{}
		for a, b := range kv {
			k[a] = b
		}
		s := map[string][]int{}
		for a, b := range shapes {
			s[a] = b
		}
		edit(k, s)
		p := filepath.Join(dir, name)
		writeGGUF(t, p, k, s)
		return p
	}
	file := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// The last tensor's data ends the file: a NaN in its last value.
	nan := slices.Clone(data)
	binary.LittleEndian.PutUint32(nan[len(nan)-4:], math.Float32bits(float32(math.NaN())))
	flipped := slices.Clone(data)
	for i := 8; i < 24; i++ { // the tensor and metadata counts
		flipped[i] ^= 0xa5
	}

	tests := []struct {
		name string
		path string
		want []string
	}{
		{"missing", filepath.Join(dir, "nope.gguf"), []string{"no such file"}},
		{"model", "../models/testdata/tinymoe-qwen2moe.gguf", []string{"not a Commit Router file (general.architecture = qwen2moe)", "pass the predictor file, not the model"}},
		{"empty", file("empty.gguf", nil), []string{"empty.gguf", "reading magic"}},
		{"not gguf", file("text.gguf", []byte("hello, world, this is not GGUF at all")), []string{"not a GGUF file"}},
		{"truncated", file("trunc.gguf", data[:len(data)/2]), []string{"trunc.gguf"}},
		{"truncated header", file("trunc2.gguf", data[:100]), []string{"trunc2.gguf"}},
		{"flipped header", file("flipped.gguf", flipped), []string{"flipped.gguf"}},
		{"nan", file("nan.gguf", nan), []string{"is NaN"}},
		{"version", variant("version.gguf", func(kv ggml.KV, _ map[string][]int) { kv[key+"version"] = uint32(2) }), []string{"version 2"}},
		{"no identity", variant("noid.gguf", func(kv ggml.KV, _ map[string][]int) { delete(kv, key+"model.expert_count") }), []string{"model.expert_count: missing"}},
		{"bad identity", variant("badid.gguf", func(kv ggml.KV, _ map[string][]int) { kv[key+"model.moe_layers"] = []int32{1, 1, 2} }), []string{"moe layers[1] = 1"}},
		{"string for int", variant("type.gguf", func(kv ggml.KV, _ map[string][]int) { kv[key+"model.embedding_length"] = "5" }), []string{"embedding_length: is string"}},
		{"no architecture", variant("noarch.gguf", func(kv ggml.KV, _ map[string][]int) { kv["general.architecture"] = "llama" }), []string{"general.architecture = llama"}},
		{"wrong shape", variant("shape.gguf", func(_ ggml.KV, s map[string][]int) { s["net.0.w1"] = []int{5, 7} }), []string{"net.0.w1 has shape [5 7], want [5 6]"}},
		{"transposed", variant("transposed.gguf", func(_ ggml.KV, s map[string][]int) { s["net.1.w1"] = []int{6, 5} }), []string{"net.1.w1 has shape [6 5]"}},
		{"missing tensor", variant("missing.gguf", func(_ ggml.KV, s map[string][]int) { delete(s, "net.1.b1") }), []string{"net.1.b1 is missing"}},
		{"half an MLP", variant("halfmlp.gguf", func(_ ggml.KV, s map[string][]int) { delete(s, "net.2.b2") }), []string{"net.2.b2 is missing"}},
		{"extra tensor", variant("extra.gguf", func(_ ggml.KV, s map[string][]int) { s["net.3.w1"] = []int{5, 6} }), []string{`unexpected tensor "net.3.w1"`}},
		{"MLP in the middle", variant("mid.gguf", func(_ ggml.KV, s map[string][]int) {
			s["net.0.w1"], s["net.0.b1"], s["net.0.w2"], s["net.0.b2"] = []int{5, 10}, []int{10}, []int{10, 6}, []int{6}
		}), []string{"net.0.w1 has shape [5 10], want [5 6]"}},
		{"record length", variant("record.gguf", func(kv ggml.KV, _ map[string][]int) { kv[key+"train.epochs"] = []uint32{1, 2} }), []string{"train.epochs: want an array of 3"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := Load(tc.path)
			if err == nil {
				t.Fatalf("loaded %+v", r.ID)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			t.Log(err)
		})
	}
	if _, err := Load(filepath.Join(dir, "nope.gguf")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing file: %v is not fs.ErrNotExist", err)
	}
}

func TestSidecarPath(t *testing.T) {
	tests := map[string]string{
		"dir/model.gguf":    "dir/model.commit-router.gguf",
		"model.GGUF":        "model.commit-router.gguf",
		"/a.b/model":        "/a.b/model.commit-router.gguf",
		"dir/model.q8.gguf": "dir/model.q8.commit-router.gguf",
	}
	for in, want := range tests {
		if got := SidecarPath(in); got != want {
			t.Errorf("SidecarPath(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestIdentityCheck(t *testing.T) {
	a := Identity{Model: "tinymoe-mixtral", Arch: "llama", Fingerprint: fp1, Layers: 4, MoELayers: []int{0, 1, 2, 3}, Experts: 8, Used: 2, Embd: 128}
	same := a
	same.Model = "renamed" // the fingerprint decides
	if err := a.Check(same); err != nil {
		t.Errorf("renamed copy: %v", err)
	}
	b := Identity{Model: "tinymoe-qwen2moe", Arch: "qwen2moe", Fingerprint: strings.Repeat("9f8e", 16), Layers: 4, MoELayers: []int{0, 1, 2, 3}, Experts: 16, Used: 4, Embd: 128}
	err := a.Check(b)
	want := `predictor trained for "tinymoe-mixtral" (llama, fingerprint 1a2b3c4d…) cannot serve "tinymoe-qwen2moe" (qwen2moe, fingerprint 9f8e9f8e…): ` +
		`fingerprint 1a2b3c4d… != 9f8e9f8e…, arch llama != qwen2moe, experts 8 != 16, used 2 != 4`
	if err == nil || err.Error() != want {
		t.Errorf("Check:\n got %v\nwant %s", err, want)
	}
	// Without a fingerprint on one side, the names stand in for it.
	c := a
	c.Fingerprint, c.MoELayers = "", []int{0, 2}
	err = c.Check(b)
	if err == nil || !strings.Contains(err.Error(), `(llama, no fingerprint)`) || !strings.Contains(err.Error(), `model "tinymoe-mixtral" != "tinymoe-qwen2moe"`) ||
		!strings.Contains(err.Error(), "moe layers [0 2] != [0 1 2 3]") {
		t.Errorf("Check: %v", err)
	}
	if err := c.Check(a); err == nil || strings.Contains(err.Error(), "fingerprint 1a2b3c4d… !=") || !strings.Contains(err.Error(), "moe layers") {
		t.Errorf("Check: %v", err)
	}
}

// FuzzLoad: no file, however damaged, makes Load panic, and what it accepts is a valid router.
func FuzzLoad(f *testing.F) {
	dir := f.TempDir()
	good := filepath.Join(dir, "seed.gguf")
	if err := Save(good, savedRouter(f)); err != nil {
		f.Fatal(err)
	}
	data, _ := os.ReadFile(good)
	f.Add(data)
	f.Add(data[:len(data)/3])
	f.Add([]byte("GGUF"))
	if model, err := os.ReadFile("../models/testdata/tiny.gguf"); err == nil {
		f.Add(model[:min(len(model), 4096)])
	}
	p := filepath.Join(dir, "fuzz.gguf") // each fuzzing worker is a process of its own
	f.Fuzz(func(t *testing.T, b []byte) {
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		r, err := Load(p)
		if err != nil {
			return
		}
		if err := r.validate(); err != nil {
			t.Fatalf("Load accepted an invalid router: %v", err)
		}
	})
}
