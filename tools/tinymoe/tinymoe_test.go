package tinymoe

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/commit-run/commit-run/engine"
	"github.com/commit-run/commit-run/quant"
)

func TestSplit(t *testing.T) {
	text := strings.Repeat("a line of text\n", 100)
	train, held, err := Split(text)
	if err != nil {
		t.Fatal(err)
	}
	if train+held != text || !strings.HasSuffix(train, "\n") {
		t.Fatalf("split is not a cut at a line start")
	}
	if share := float64(len(held)) / float64(len(text)); share < 0.09 || share > 0.1 {
		t.Errorf("held-out share %.3f, want just under 10%%", share)
	}
	for _, bad := range []string{"no line break at all in this text", "caf\xe9\n"} {
		if _, _, err := Split(bad); err == nil {
			t.Errorf("Split(%q): no error", bad)
		}
	}
}

// TestHeldOutFile checks that the committed held-out text is exactly the last part of War and
// Peace that Split holds out, so the bundled models never saw it.
func TestHeldOutFile(t *testing.T) {
	path, err := FindText(".")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	_, held, err := Split(string(b))
	if err != nil {
		t.Fatal(err)
	}
	committed, err := os.ReadFile("../../models/testdata/war-and-peace-heldout.txt")
	if err != nil {
		t.Fatal(err)
	}
	if string(committed) != held {
		t.Fatalf("models/testdata/war-and-peace-heldout.txt (%d bytes) is not the held-out split (%d bytes)", len(committed), len(held))
	}
}

func TestTrainBPE(t *testing.T) {
	text := strings.Repeat("the cat sat on the mat; the hat. ", 50) + "\nA zebra!\n"
	v, err := TrainBPE(text, 300)
	if err != nil {
		t.Fatal(err)
	}
	if len(v.Tokens) > 300 || len(v.Merges) != len(v.Tokens)-257 || v.Tokens[v.EOS()] != EndOfText {
		t.Fatalf("%d tokens, %d merges, last %q", len(v.Tokens), len(v.Merges), v.Tokens[len(v.Tokens)-1])
	}
	// " the" and "at" are the most frequent pairs' material; ties break by token order.
	if v.Merges[0] != "a t" && v.Merges[0] != "Ġ t" {
		t.Errorf("first merge %q", v.Merges[0])
	}
	v2, err := TrainBPE(text, 300)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(v.Merges, v2.Merges) {
		t.Error("training is not deterministic")
	}
	tok, err := v.Tokenizer()
	if err != nil {
		t.Fatal(err)
	}
	ids, err := tok.Encode(text, false, false)
	if err != nil {
		t.Fatal(err)
	}
	if got := tok.Decode(ids); got != text {
		t.Errorf("round trip changed the text")
	}
	if len(ids) > len(text)/3 {
		t.Errorf("%d tokens for %d bytes: the merges do not compress", len(ids), len(text))
	}
	if _, err := TrainBPE(text, 100); err == nil {
		t.Error("vocabulary below 257: no error")
	}
}

func TestUnigram(t *testing.T) {
	// Train counts: token 0 twice, token 1 once; vocabulary 2, add-one: p0 = 3/5, p1 = 2/5.
	got := UnigramBitsPerByte([]int32{0, 0, 1}, []int32{0, 1}, 2, 4)
	want := (-math.Log2(3.0/5) - math.Log2(2.0/5)) / 4
	if math.Abs(got-want) > 1e-12 {
		t.Errorf("unigram %v, want %v", got, want)
	}
	if got := ByteUnigramBitsPerByte("aaaa", "a"); got >= ByteUnigramBitsPerByte("aaaa", "b") {
		t.Errorf("a seen byte costs %v bits, no less than an unseen one", got)
	}
}

// writeSafetensors writes tensors the way train.py does.
func writeSafetensors(t *testing.T, path string, shapes map[string][]int, data map[string][]float32) {
	t.Helper()
	hdr := map[string]any{"__metadata__": map[string]string{"step": "1"}}
	var blob []byte
	names := make([]string, 0, len(data))
	for n := range data {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		start := len(blob)
		for _, v := range data[n] {
			blob = binary.LittleEndian.AppendUint32(blob, math.Float32bits(v))
		}
		hdr[n] = map[string]any{"dtype": "F32", "shape": shapes[n], "data_offsets": []int{start, len(blob)}}
	}
	h, err := json.Marshal(hdr)
	if err != nil {
		t.Fatal(err)
	}
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(h)))
	out = append(append(out, h...), blob...)
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestParseSafetensorsErrors(t *testing.T) {
	good := func() []byte {
		p := filepath.Join(t.TempDir(), "w.safetensors")
		writeSafetensors(t, p, map[string][]int{"a": {2}}, map[string][]float32{"a": {1, 2}})
		b, _ := os.ReadFile(p)
		return b
	}
	if w, err := parseSafetensors(good(), "good"); err != nil || !slices.Equal(w.Data["a"], []float32{1, 2}) {
		t.Fatalf("good file: %v %v", w, err)
	}
	cases := map[string][]byte{
		"short":        {1, 2},
		"huge header":  binary.LittleEndian.AppendUint64(nil, 1<<40),
		"bad json":     append(binary.LittleEndian.AppendUint64(nil, 3), "{x}"...),
		"wrong dtype":  []byte(strings.Replace(string(good()), `"F32"`, `"F16"`, 1)),
		"past the end": good()[:len(good())-1],
	}
	for name, b := range cases {
		if _, err := parseSafetensors(b, name); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// TestExport writes a randomly initialised variant of each config through the exporter and
// opens it with the engine.
func TestExport(t *testing.T) {
	v, err := TrainBPE(strings.Repeat("the cat sat on the mat. ", 40), 300)
	if err != nil {
		t.Fatal(err)
	}
	for _, cfgName := range []string{"mixtral", "qwen2moe"} {
		t.Run(cfgName, func(t *testing.T) {
			c, err := LoadConfig(filepath.Join("configs", cfgName+".json"))
			if err != nil {
				t.Fatal(err)
			}
			c.Layers = 2
			shapes, data := randomWeights(c, len(v.Tokens))
			dir := t.TempDir()
			wpath := filepath.Join(dir, "w.safetensors")
			writeSafetensors(t, wpath, shapes, data)
			w, err := ReadSafetensors(wpath)
			if err != nil {
				t.Fatal(err)
			}
			gguf := filepath.Join(dir, "m.gguf")
			if _, err := Export(c, v, w, quant.Q8_0, gguf); err != nil {
				t.Fatal(err)
			}
			m, err := engine.Open(gguf, engine.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			info := m.Info()
			if info.Architecture != c.Arch || info.Experts != c.Experts || info.ExpertsUsed != c.ExpertsUsed ||
				!slices.Equal(info.ChatStop, []string{ChatStop}) || info.ChatTemplate != ChatTemplate {
				t.Errorf("exported model reads back as %+v", info)
			}

			// A missing tensor and a wrongly shaped one are refused by name.
			delete(w.Data, "blk.0.ffn_gate_inp.weight")
			if _, err := Export(c, v, w, quant.F16, gguf); err == nil || !strings.Contains(err.Error(), "ffn_gate_inp") {
				t.Errorf("missing tensor: %v", err)
			}
			w.Data["blk.0.ffn_gate_inp.weight"] = data["blk.0.ffn_gate_inp.weight"]
			w.Shapes["blk.0.attn_q.weight"] = []int{1, c.Embd * c.Embd}
			if _, err := Export(c, v, w, quant.F16, gguf); err == nil || !strings.Contains(err.Error(), "attn_q") {
				t.Errorf("wrong shape: %v", err)
			}
		})
	}
}

// randomWeights makes train.py's tensors for config c with random values.
func randomWeights(c *Config, vocab int) (map[string][]int, map[string][]float32) {
	shapes := map[string][]int{}
	hd := c.Embd / c.Heads
	add := func(name string, shape ...int) { shapes[name] = shape }
	add("token_embd.weight", vocab, c.Embd)
	add("output_norm.weight", c.Embd)
	add("output.weight", vocab, c.Embd)
	for i := 0; i < c.Layers; i++ {
		p := "blk." + string(rune('0'+i)) + "."
		add(p+"attn_norm.weight", c.Embd)
		add(p+"attn_q.weight", c.Heads*hd, c.Embd)
		add(p+"attn_k.weight", c.HeadsKV*hd, c.Embd)
		add(p+"attn_v.weight", c.HeadsKV*hd, c.Embd)
		add(p+"attn_output.weight", c.Embd, c.Heads*hd)
		if c.Arch == "qwen2moe" {
			add(p+"attn_q.bias", c.Heads*hd)
			add(p+"attn_k.bias", c.HeadsKV*hd)
			add(p+"attn_v.bias", c.HeadsKV*hd)
		}
		add(p+"ffn_norm.weight", c.Embd)
		add(p+"ffn_gate_inp.weight", c.Experts, c.Embd)
		add(p+"ffn_gate_exps.weight", c.Experts, c.ExpertFFN, c.Embd)
		add(p+"ffn_up_exps.weight", c.Experts, c.ExpertFFN, c.Embd)
		add(p+"ffn_down_exps.weight", c.Experts, c.Embd, c.ExpertFFN)
		if c.SharedFFN > 0 {
			add(p+"ffn_gate_inp_shexp.weight", c.Embd)
			add(p+"ffn_gate_shexp.weight", c.SharedFFN, c.Embd)
			add(p+"ffn_up_shexp.weight", c.SharedFFN, c.Embd)
			add(p+"ffn_down_shexp.weight", c.Embd, c.SharedFFN)
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	data := map[string][]float32{}
	for n, s := range shapes {
		size := 1
		for _, d := range s {
			size *= d
		}
		v := make([]float32, size)
		for i := range v {
			v[i] = float32(r.NormFloat64() * 0.05)
		}
		data[n] = v
	}
	return shapes, data
}
