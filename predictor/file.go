package predictor

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/ollama/ollama/fs/ggml"

	"github.com/commit-run/commit-run/models"
)

// Architecture is general.architecture of a Commit Router file, and Version the format
// version this package writes and reads.
const (
	Architecture = "commit-router"
	Version      = 1
)

// key prefixes every metadata key but general.*: GGUF keys architecture-specific metadata
// by the architecture's name, and ollama's writer and reader both enforce that.
const key = Architecture + "."

// SidecarPath is where a model's Commit Router lives by default: beside it, with
// ".commit-router.gguf" in place of ".gguf" ("dir/model.gguf" -> "dir/model.commit-router.gguf").
func SidecarPath(modelPath string) string {
	base := modelPath
	if ext := filepath.Ext(base); strings.EqualFold(ext, ".gguf") {
		base = strings.TrimSuffix(base, ext)
	}
	return base + ".commit-router.gguf"
}

// Save writes r to path as GGUF: to path+".tmp" first, synced, then renamed over path, so
// that a crash leaves either the old file or the new one, never half of one.
func Save(path string, r *Router) error {
	if err := r.validate(); err != nil {
		return fmt.Errorf("predictor: save %s: %w", path, err)
	}
	kv, ts := r.encode()
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return fmt.Errorf("predictor: save: %w", err)
	}
	err = ggml.WriteGGUF(f, kv, ts)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("predictor: save %s: %w", path, err)
	}
	return nil
}

// validate checks a router before it is saved, so that Save never writes a file Load refuses.
func (r *Router) validate() error {
	if r == nil {
		return errors.New("no router")
	}
	if err := r.ID.validate(); err != nil {
		return fmt.Errorf("identity: %w", err)
	}
	m := len(r.ID.MoELayers)
	if len(r.Nets) != m {
		return fmt.Errorf("%d nets for %d MoE layers", len(r.Nets), m)
	}
	for j, n := range r.Nets {
		if n == nil {
			return fmt.Errorf("net %d is missing", j)
		}
		if err := n.check(r.ID.Embd, r.ID.Experts, j == m-1); err != nil {
			return fmt.Errorf("net %d: %w", j, err)
		}
	}
	if in := r.Info.Nets; in != nil && len(in) != m {
		return fmt.Errorf("training record for %d nets, the router has %d", len(in), m)
	}
	return nil
}

func (r *Router) encode() (ggml.KV, []*ggml.Tensor) {
	id, in := r.ID, r.Info
	moe := make([]int32, len(id.MoELayers))
	for i, l := range id.MoELayers {
		moe[i] = int32(l)
	}
	kv := ggml.KV{
		"general.architecture":          Architecture,
		"general.name":                  "Commit Router for " + id.Model,
		key + "version":                 uint32(Version),
		key + "model.name":              id.Model,
		key + "model.arch":              id.Arch,
		key + "model.fingerprint":       id.Fingerprint,
		key + "model.block_count":       uint32(id.Layers),
		key + "model.moe_layers":        moe,
		key + "model.expert_count":      uint32(id.Experts),
		key + "model.expert_used_count": uint32(id.Used),
		key + "model.embedding_length":  uint32(id.Embd),

		key + "train.source":       in.Source,
		key + "train.created":      in.Created,
		key + "train.tokens":       uint64(max(in.Tokens, 0)),
		key + "train.lr":           float32(in.LR),
		key + "train.step_epochs":  uint32(max(in.StepEpochs, 0)),
		key + "train.gamma":        float32(in.Gamma),
		key + "train.max_epochs":   uint32(max(in.MaxEpochs, 0)),
		key + "train.patience":     uint32(max(in.Patience, 0)),
		key + "train.min_delta":    float32(in.MinDelta),
		key + "train.batch":        uint32(max(in.Batch, 0)),
		key + "train.val_fraction": float32(in.ValFraction),
		key + "train.seed":         in.Seed,
	}
	if in.Nets != nil {
		encodeNetInfo(kv, in.Nets)
	}
	return kv, r.encodeTensors()
}

// encodeNetInfo stores the per-net training record as one array per field, indexed by net,
// so that each field reads back as a plain GGUF array.
func encodeNetInfo(kv ggml.KV, nets []NetInfo) {
	var (
		init                  []string
		trainN, valN          []uint32
		epochs, best          []uint32
		tLoss, vLoss, vAccura []float32
	)
	for _, n := range nets {
		init = append(init, n.Init)
		trainN = append(trainN, uint32(max(n.TrainSamples, 0)))
		valN = append(valN, uint32(max(n.ValSamples, 0)))
		epochs = append(epochs, uint32(max(n.Epochs, 0)))
		best = append(best, uint32(max(n.BestEpoch, 0)))
		tLoss = append(tLoss, float32(n.TrainLoss))
		vLoss = append(vLoss, float32(n.ValLoss))
		vAccura = append(vAccura, float32(n.ValAccuracy))
	}
	kv[key+"train.init"] = init
	kv[key+"train.train_samples"] = trainN
	kv[key+"train.val_samples"] = valN
	kv[key+"train.epochs"] = epochs
	kv[key+"train.best_epoch"] = best
	kv[key+"train.train_loss"] = tLoss
	kv[key+"train.val_loss"] = vLoss
	kv[key+"train.val_accuracy"] = vAccura
}

// encodeTensors stores every net's weights as F32, which loses nothing of what training
// learnt and is the one type Load accepts.
func (r *Router) encodeTensors() []*ggml.Tensor {
	var ts []*ggml.Tensor
	add := func(name string, data []float32, shape ...int) {
		sh := make([]uint64, len(shape))
		for i, d := range shape {
			sh[i] = uint64(d)
		}
		b := make([]byte, 4*len(data))
		for i, v := range data {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
		}
		ts = append(ts, &ggml.Tensor{Name: name, Kind: uint32(ggml.TensorTypeF32), Shape: sh, WriterTo: bytes.NewReader(b)})
	}
	for j, n := range r.Nets {
		rows := n.Out
		if n.Hidden > 0 {
			rows = n.Hidden
			add(tensorName(j, "w2"), n.W2, n.Hidden, n.Out)
			add(tensorName(j, "b2"), n.B2, n.Out)
		}
		add(tensorName(j, "w1"), n.W1, n.In, rows)
		add(tensorName(j, "b1"), n.B1, rows)
	}
	return ts
}

func tensorName(j int, what string) string { return "net." + strconv.Itoa(j) + "." + what }

// Load reads a Commit Router file and checks all of it: the architecture and version, the
// identity, every tensor's presence, type (F32), shape and values (finite), and that nothing
// else is there. The weights are copied out of the file, which is closed before Load returns.
func Load(path string) (*Router, error) {
	// models.Open speaks of "model"; open it once ourselves for a plain message when the
	// file is not there (errors.Is(err, fs.ErrNotExist) holds).
	if f, err := os.Open(path); err != nil {
		return nil, fmt.Errorf("predictor: %w", err)
	} else {
		f.Close()
	}
	mf, err := models.Open(path)
	if err != nil {
		return nil, fmt.Errorf("predictor: %w", err) // err names the path
	}
	defer mf.Close()
	r, err := decode(mf)
	if err != nil {
		return nil, fmt.Errorf("predictor: %s: %w", path, err)
	}
	return r, nil
}

// meta reads typed metadata and remembers the first problem.
type meta struct {
	kv  ggml.KV
	err error
}

func (m *meta) fail(k string, format string, a ...any) {
	if m.err == nil {
		m.err = fmt.Errorf("metadata %s: %s", k, fmt.Sprintf(format, a...))
	}
}

// uint reads an unsigned integer of any width up to limit; absent is an error when required.
func (m *meta) uint(k string, limit uint64, required bool) uint64 {
	v, ok := m.kv[k]
	if !ok {
		if required {
			m.fail(k, "missing")
		}
		return 0
	}
	var u uint64
	switch x := v.(type) {
	case uint8:
		u = uint64(x)
	case uint16:
		u = uint64(x)
	case uint32:
		u = uint64(x)
	case uint64:
		u = x
	case int32:
		if x < 0 {
			m.fail(k, "%d is negative", x)
			return 0
		}
		u = uint64(x)
	case int64:
		if x < 0 {
			m.fail(k, "%d is negative", x)
			return 0
		}
		u = uint64(x)
	default:
		m.fail(k, "is %T, want an unsigned integer", v)
		return 0
	}
	if u > limit {
		m.fail(k, "%d exceeds %d", u, limit)
		return 0
	}
	return u
}

func (m *meta) string(k string, required bool) string {
	v, ok := m.kv[k]
	if !ok {
		if required {
			m.fail(k, "missing")
		}
		return ""
	}
	s, isStr := v.(string)
	if !isStr {
		m.fail(k, "is %T, want a string", v)
	}
	return s
}

// float reads an f32 as the shortest decimal that rounds to it, so that 5e-5 saved comes
// back as 5e-5 and not 4.99999987e-05.
func (m *meta) float(k string) float64 {
	v, ok := m.kv[k]
	if !ok {
		return 0
	}
	f, isF := v.(float32)
	if !isF {
		m.fail(k, "is %T, want f32", v)
		return 0
	}
	d, _ := strconv.ParseFloat(strconv.FormatFloat(float64(f), 'g', -1, 32), 64)
	return d
}

// array reads an array metadata value with n elements through get (one of ggml.KV's typed
// array readers, which take the key without the architecture prefix and return nil for an
// array of another type); absent is nil.
func array[T any](m *meta, k string, n int, get func(string, ...[]T) []T) []T {
	if _, ok := m.kv[k]; !ok {
		return nil
	}
	a := get(strings.TrimPrefix(k, key))
	if len(a) != n {
		var zero T
		m.fail(k, "want an array of %d %T", n, zero)
		return nil
	}
	return a
}

func decode(mf *models.File) (*Router, error) {
	m := &meta{kv: mf.KV}
	arch := m.string("general.architecture", false)
	switch {
	case arch == "":
		return nil, errors.New("is not a Commit Router file (no general.architecture): pass the predictor file, not the model")
	case arch != Architecture:
		return nil, fmt.Errorf("is not a Commit Router file (general.architecture = %s): pass the predictor file, not the model", arch)
	}
	if v := m.uint(key+"version", math.MaxUint32, true); m.err == nil && v != Version {
		return nil, fmt.Errorf("Commit Router format version %d; this build reads version %d", v, Version)
	}
	var id Identity
	id.Model = m.string(key+"model.name", true)
	id.Arch = m.string(key+"model.arch", true)
	id.Fingerprint = m.string(key+"model.fingerprint", false)
	id.Layers = int(m.uint(key+"model.block_count", maxLayers, true))
	id.Experts = int(m.uint(key+"model.expert_count", maxExperts, true))
	id.Used = int(m.uint(key+"model.expert_used_count", maxExperts, true))
	id.Embd = int(m.uint(key+"model.embedding_length", maxEmbd, true))
	if m.err != nil {
		return nil, m.err
	}
	if _, ok := m.kv[key+"model.moe_layers"]; !ok {
		return nil, fmt.Errorf("metadata %smodel.moe_layers: missing", key)
	}
	moe := mf.KV.Ints("model.moe_layers")
	if len(moe) == 0 || len(moe) > maxLayers {
		return nil, fmt.Errorf("metadata %smodel.moe_layers: want a non-empty array of int32 of at most %d", key, maxLayers)
	}
	for _, l := range moe {
		id.MoELayers = append(id.MoELayers, int(l))
	}
	if err := id.validate(); err != nil {
		return nil, fmt.Errorf("identity: %w", err)
	}
	r := &Router{ID: id, Nets: make([]*Net, len(id.MoELayers))}
	if err := r.readInfo(m); err != nil {
		return nil, err
	}
	if err := r.readNets(mf); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *Router) readInfo(m *meta) error {
	in := &r.Info
	in.Source = m.string(key+"train.source", false)
	in.Created = m.string(key+"train.created", false)
	in.Tokens = int(m.uint(key+"train.tokens", math.MaxInt32, false))
	in.LR = m.float(key + "train.lr")
	in.StepEpochs = int(m.uint(key+"train.step_epochs", math.MaxInt32, false))
	in.Gamma = m.float(key + "train.gamma")
	in.MaxEpochs = int(m.uint(key+"train.max_epochs", math.MaxInt32, false))
	in.Patience = int(m.uint(key+"train.patience", math.MaxInt32, false))
	in.MinDelta = m.float(key + "train.min_delta")
	in.Batch = int(m.uint(key+"train.batch", math.MaxInt32, false))
	in.ValFraction = m.float(key + "train.val_fraction")
	in.Seed = m.uint(key+"train.seed", math.MaxUint64, false)
	if !(in.ValFraction >= 0 && in.ValFraction < 1) {
		m.fail(key+"train.val_fraction", "%v: want 0 <= f < 1", in.ValFraction)
	}
	n := len(r.Nets)
	init := array(m, key+"train.init", n, m.kv.Strings)
	trainN := array(m, key+"train.train_samples", n, m.kv.Uints)
	valN := array(m, key+"train.val_samples", n, m.kv.Uints)
	epochs := array(m, key+"train.epochs", n, m.kv.Uints)
	best := array(m, key+"train.best_epoch", n, m.kv.Uints)
	tLoss := array(m, key+"train.train_loss", n, m.kv.Floats)
	vLoss := array(m, key+"train.val_loss", n, m.kv.Floats)
	vAcc := array(m, key+"train.val_accuracy", n, m.kv.Floats)
	if m.err != nil {
		return m.err
	}
	if init == nil {
		return nil // an untrained router
	}
	in.Nets = make([]NetInfo, n)
	at := func(a []uint32, j int) int {
		if a == nil {
			return 0
		}
		return int(a[j])
	}
	atF := func(a []float32, j int) float64 {
		if a == nil {
			return 0
		}
		return float64(a[j])
	}
	for j := range in.Nets {
		in.Nets[j] = NetInfo{Init: init[j], TrainSamples: at(trainN, j), ValSamples: at(valN, j),
			Epochs: at(epochs, j), BestEpoch: at(best, j),
			TrainLoss: atF(tLoss, j), ValLoss: atF(vLoss, j), ValAccuracy: atF(vAcc, j)}
	}
	return nil
}

// readNets finds, checks and copies every net's tensors.
func (r *Router) readNets(mf *models.File) error {
	m, d, e := len(r.Nets), r.ID.Embd, r.ID.Experts
	want := 0
	for j := range r.Nets {
		n := &Net{In: d, Out: e}
		if j == m-1 && mf.Tensor(tensorName(j, "w2")) != nil {
			n.Hidden = 2 * d
		}
		rows := e
		var err error
		if n.Hidden > 0 {
			rows = n.Hidden
			if n.W2, err = tensor(mf, tensorName(j, "w2"), n.Hidden, e); err != nil {
				return err
			}
			if n.B2, err = tensor(mf, tensorName(j, "b2"), e); err != nil {
				return err
			}
			want += 2
		}
		if n.W1, err = tensor(mf, tensorName(j, "w1"), d, rows); err != nil {
			return err
		}
		if n.B1, err = tensor(mf, tensorName(j, "b1"), rows); err != nil {
			return err
		}
		want += 2
		r.Nets[j] = n
	}
	if len(mf.Tensors) != want {
		for _, t := range mf.Tensors {
			if !r.expects(t.Name) {
				return fmt.Errorf("unexpected tensor %q (a router for %d MoE layers has nets 0..%d, each with w1 and b1, the last maybe w2 and b2)", t.Name, m, m-1)
			}
		}
		return fmt.Errorf("%d tensors, want %d", len(mf.Tensors), want)
	}
	return nil
}

func (r *Router) expects(name string) bool {
	for j, n := range r.Nets {
		ws := []string{"w1", "b1"}
		if n.Hidden > 0 {
			ws = append(ws, "w2", "b2")
		}
		for _, w := range ws {
			if name == tensorName(j, w) {
				return true
			}
		}
	}
	return false
}

// tensor copies the named F32 tensor of shape ne (ggml order: ne[0] is the row length) out
// of the mapping, checking every value is finite.
func tensor(mf *models.File, name string, ne ...int) ([]float32, error) {
	t := mf.Tensor(name)
	if t == nil {
		return nil, fmt.Errorf("tensor %s is missing", name)
	}
	if uint32(t.Type) != uint32(ggml.TensorTypeF32) {
		return nil, fmt.Errorf("tensor %s is %v, want F32", name, t.Type)
	}
	if !sameShape(t.Ne, ne) {
		return nil, fmt.Errorf("tensor %s has shape %v, want %v", name, t.Ne, ne)
	}
	n := 1
	for _, d := range ne {
		n *= d
	}
	if len(t.Data) != 4*n {
		return nil, fmt.Errorf("tensor %s has %d bytes, want %d", name, len(t.Data), 4*n)
	}
	out := make([]float32, n)
	for i := range out {
		v := math.Float32frombits(binary.LittleEndian.Uint32(t.Data[4*i:]))
		if !finite(v) {
			return nil, fmt.Errorf("tensor %s: value %d is %v", name, i, v)
		}
		out[i] = v
	}
	return out, nil
}

// sameShape compares shapes as ggml does: trailing 1s do not count.
func sameShape(a, b []int) bool {
	trim := func(s []int) []int {
		for len(s) > 1 && s[len(s)-1] == 1 {
			s = s[:len(s)-1]
		}
		return s
	}
	a, b = trim(a), trim(b)
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
