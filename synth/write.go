package synth

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"

	"github.com/ollama/ollama/fs/ggml"

	"github.com/commit-run/commit-run/quant"
)

// Tensor is one tensor of a generated model: its GGUF name, ggml shape and type.
type Tensor struct {
	Name  string
	Shape []uint64
	Type  quant.Type
}

// Model is a spec made concrete: its metadata and tensor list, ready to be written.
type Model struct {
	Spec    Spec
	KV      ggml.KV
	Tensors []Tensor
	defs    []tensorDef
}

// Build resolves a spec into metadata and typed tensors without generating any weights.
func Build(s Spec) (*Model, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	voc, err := buildVocab(s.Tokenizer, s.Vocab)
	if err != nil {
		return nil, fmt.Errorf("spec %q: %w", s.Name, err)
	}
	defs, err := s.tensorDefs()
	if err != nil {
		return nil, fmt.Errorf("spec %q: %w", s.Name, err)
	}
	m := &Model{Spec: s, KV: s.metadata(voc), defs: defs}
	w := slot{layers: s.Layers, experts: s.Experts, tied: s.Tied}
	for _, d := range defs {
		if d.quantizable && valueLike(d.role) {
			w.nwv++
		}
	}
	for _, d := range defs {
		t := quant.F32
		if d.quantizable {
			w.role, w.layer = d.role, d.layer
			t = s.Types.typeOf(w, int(d.shape[0]))
			if valueLike(d.role) {
				w.wv++
			}
		}
		m.Tensors = append(m.Tensors, Tensor{Name: d.name, Shape: d.shape, Type: t})
	}
	return m, nil
}

// metadata returns the GGUF key-values of a spec, with every key spelled in full.
func (s *Spec) metadata(voc *vocab) ggml.KV {
	a := s.Arch + "."
	kv := ggml.KV{
		"general.architecture":                 s.Arch,
		"general.name":                         s.Name,
		"general.file_type":                    s.Types.FileType,
		a + "context_length":                   uint32(s.Context),
		a + "embedding_length":                 uint32(s.Embd),
		a + "block_count":                      uint32(s.Layers),
		a + "attention.head_count":             uint32(s.Heads),
		a + "attention.head_count_kv":          uint32(s.headsKV()),
		a + "attention.layer_norm_rms_epsilon": s.Eps,
		a + "rope.freq_base":                   s.RopeBase,
		a + "vocab_size":                       uint32(s.Vocab),
	}
	if s.Types.Base != quant.F32 && s.Types.Base != quant.F16 && s.Types.Base != quant.BF16 {
		kv["general.quantization_version"] = uint32(2)
	}
	for k, v := range voc.kv() {
		kv[k] = v
	}
	if s.Experts > 0 {
		kv[a+"expert_count"] = uint32(s.Experts)
		kv[a+"expert_used_count"] = uint32(s.ExpertsUsed)
	}
	s.archMetadata(kv)
	if s.HeadDim != 0 {
		kv[a+"attention.key_length"] = uint32(s.HeadDim)
		kv[a+"attention.value_length"] = uint32(s.HeadDim)
	}
	if y := s.YaRN; y != nil {
		kv[a+"rope.scaling.type"] = "yarn"
		kv[a+"rope.scaling.factor"] = y.Factor
		kv[a+"rope.scaling.original_context_length"] = uint32(y.OrigContext)
		if y.LogMultiplier != 0 {
			kv[a+"rope.scaling.yarn_log_multiplier"] = y.LogMultiplier
		}
	}
	return kv
}

// archMetadata adds the keys whose names or meaning differ between architectures: each
// family's converter spells its feed-forward widths its own way.
func (s *Spec) archMetadata(kv ggml.KV) {
	a := s.Arch + "."
	switch s.Arch {
	case ArchLlama:
		// Mixtral's files store the expert width as feed_forward_length.
		kv[a+"feed_forward_length"] = uint32(s.FFN)
		if s.Experts > 0 {
			kv[a+"feed_forward_length"] = uint32(s.ExpertFFN)
		}
		kv[a+"rope.dimension_count"] = uint32(s.headDim())
	case ArchQwen2, ArchQwen3:
		kv[a+"feed_forward_length"] = uint32(s.FFN)
	case ArchQwen2MoE:
		// Qwen1.5-MoE writes the shared width as feed_forward_length too.
		kv[a+"feed_forward_length"] = uint32(s.SharedFFN)
		kv[a+"expert_feed_forward_length"] = uint32(s.ExpertFFN)
		kv[a+"expert_shared_feed_forward_length"] = uint32(s.SharedFFN)
	case ArchQwen3MoE:
		kv[a+"feed_forward_length"] = uint32(s.FFN)
		kv[a+"expert_feed_forward_length"] = uint32(s.ExpertFFN)
	case ArchOLMoE:
		kv[a+"feed_forward_length"] = uint32(s.ExpertFFN)
	case ArchDeepSeek2:
		s.deepseek2Metadata(kv)
	case ArchGLM4MoE:
		kv[a+"feed_forward_length"] = uint32(s.FFN)
		kv[a+"expert_feed_forward_length"] = uint32(s.ExpertFFN)
		kv[a+"leading_dense_block_count"] = uint32(s.LeadingDense)
		kv[a+"expert_shared_count"] = uint32(s.SharedExperts)
		kv[a+"expert_weights_norm"] = s.ExpertWeightsNorm
		kv[a+"expert_weights_scale"] = s.ExpertWeightsScale
		kv[a+"expert_gating_func"] = uint32(2) // sigmoid
		kv[a+"rope.dimension_count"] = uint32(s.RopeDim)
	case ArchGPTOSS:
		s.gptossMetadata(kv)
	case ArchQwen35MoE:
		s.qwen35Metadata(kv)
	}
	if s.NextN > 0 {
		kv[a+"nextn_predict_layers"] = uint32(s.NextN)
	}
	if s.ExpertGroups > 1 {
		kv[a+"expert_group_count"] = uint32(s.ExpertGroups)
		kv[a+"expert_group_used_count"] = uint32(s.ExpertGroupsUsed)
	}
}

// deepseek2Metadata adds DeepSeek2's routing and MLA keys, which only its files carry.
func (s *Spec) deepseek2Metadata(kv ggml.KV) {
	a := s.Arch + "."
	kv[a+"feed_forward_length"] = uint32(s.FFN)
	kv[a+"expert_feed_forward_length"] = uint32(s.ExpertFFN)
	kv[a+"leading_dense_block_count"] = uint32(s.LeadingDense)
	kv[a+"expert_shared_count"] = uint32(s.SharedExperts)
	kv[a+"expert_weights_norm"] = s.ExpertWeightsNorm
	kv[a+"expert_gating_func"] = uint32(1) // softmax
	if s.SigmoidGating {
		kv[a+"expert_gating_func"] = uint32(2)
	}
	if s.ExpertWeightsScale != 0 {
		kv[a+"expert_weights_scale"] = s.ExpertWeightsScale
	}
	// llama.cpp requires q_lora_rank unless the layer count says "Lite"; 0 means no q LoRA.
	kv[a+"attention.q_lora_rank"] = uint32(s.QLoraRank)
	kv[a+"attention.kv_lora_rank"] = uint32(s.KVLoraRank)
	kv[a+"rope.dimension_count"] = uint32(s.RopeDim)
	if s.MLA {
		// One shared KV head holding [kv_lora | k_pe]; the per-head sizes move to *_mla.
		kv[a+"attention.head_count_kv"] = uint32(1)
		kv[a+"attention.key_length"] = uint32(s.KVLoraRank + s.RopeDim)
		kv[a+"attention.value_length"] = uint32(s.KVLoraRank)
		kv[a+"attention.key_length_mla"] = uint32(s.QKNopeDim + s.RopeDim)
		kv[a+"attention.value_length_mla"] = uint32(s.VHeadDim)
	} else {
		kv[a+"attention.key_length"] = uint32(s.QKNopeDim + s.RopeDim)
		kv[a+"attention.value_length"] = uint32(s.VHeadDim)
	}
}

// Bytes returns the size of the tensor data of the model (not counting metadata).
func (m *Model) Bytes() int64 {
	var n int64
	for _, t := range m.Tensors {
		rb, _ := t.Type.RowBytes(int(t.Shape[0]))
		rows := int64(1)
		for _, d := range t.Shape[1:] {
			rows *= int64(d)
		}
		n += int64(rb) * rows
	}
	return n
}

// Write generates the weights and writes the model as GGUF to path, returning the hex SHA-256
// of the file. Tensors are generated one at a time as the writer asks for them, so memory use
// stays near the size of the largest tensors, not of the file.
func (m *Model) Write(path string) (string, error) {
	f, err := os.Create(path)
	if err != nil {
		return "", fmt.Errorf("write model %s: %w", m.Spec.Name, err)
	}
	ts := make([]*ggml.Tensor, len(m.Tensors))
	for i := range m.Tensors {
		ts[i] = &ggml.Tensor{
			Name:     m.Tensors[i].Name,
			Kind:     uint32(m.Tensors[i].Type),
			Shape:    m.Tensors[i].Shape,
			WriterTo: &tensorWriter{seed: m.Spec.Seed, def: &m.defs[i], typ: m.Tensors[i].Type},
		}
	}
	if err := ggml.WriteGGUF(f, m.KV, ts); err != nil {
		f.Close()
		return "", fmt.Errorf("write model %s to %s: %w", m.Spec.Name, path, err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		f.Close()
		return "", fmt.Errorf("hash %s: %w", path, err)
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		f.Close()
		return "", fmt.Errorf("hash %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return "", fmt.Errorf("write model %s to %s: %w", m.Spec.Name, path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// WriteFile builds a spec and writes it to path; it returns the file's hex SHA-256.
func WriteFile(s Spec, path string) (string, error) {
	m, err := Build(s)
	if err != nil {
		return "", err
	}
	return m.Write(path)
}

// tensorWriter generates one tensor's values and encodes them to its type, row by row.
type tensorWriter struct {
	seed uint64
	def  *tensorDef
	typ  quant.Type
}

func (tw *tensorWriter) WriteTo(w io.Writer) (int64, error) {
	d := tw.def
	ne0 := int(d.shape[0])
	rows := int(d.elements()) / ne0
	rb, err := tw.typ.RowBytes(ne0)
	if err != nil {
		return 0, fmt.Errorf("tensor %s: %w", d.name, err)
	}
	r := newRNG(tw.seed, d.name)
	var rowScale []float64
	if d.init == initRouter {
		// One factor per expert (per row of the router), drawn from a stream of its own.
		fr := newRNG(tw.seed, d.name+"#experts")
		rowScale = make([]float64, rows)
		for i := range rowScale {
			rowScale[i] = float64(0.5 + float64(1.2*fr.uniform()))
		}
	}
	// Buffer many rows per write: the writer is an io.OffsetWriter straight onto the file.
	const chunk = 1 << 20
	perChunk := max(1, chunk/rb)
	buf := make([]byte, 0, perChunk*rb)
	row := make([]float32, ne0)
	var written int64
	for i := 0; i < rows; i++ {
		for j := range row {
			var x float64
			switch d.init {
			case initNorm:
				// RMSNorm weights of trained models sit around 1 with real spread.
				x = float64(0.5*r.sym()) + 1
			case initRouter:
				x = float64(r.normal()*d.std) * rowScale[i]
			case initDecay:
				x = -(0.525 + 0.475*r.sym())
			default:
				x = float64(r.normal() * d.std)
			}
			row[j] = float32(x)
		}
		buf = buf[:len(buf)+rb]
		if err := encodeRow(tw.typ, row, buf[len(buf)-rb:]); err != nil {
			return written, fmt.Errorf("tensor %s: %w", d.name, err)
		}
		if len(buf) == cap(buf) || i == rows-1 {
			n, err := w.Write(buf)
			written += int64(n)
			if err != nil {
				return written, fmt.Errorf("tensor %s: %w", d.name, err)
			}
			buf = buf[:0]
		}
	}
	return written, nil
}

// encodeRow stores one row in type t. quant.QuantizeRow panics on a length mismatch, which
// RowBytes above rules out.
func encodeRow(t quant.Type, src []float32, dst []byte) error {
	if !t.Weight() {
		return fmt.Errorf("cannot store weights as %v", t)
	}
	quant.QuantizeRow(t, src, dst)
	return nil
}
