package engine

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/commit-run/commit-run/cuda"
	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/eprun"
	"github.com/commit-run/commit-run/models"
	"github.com/commit-run/commit-run/multigpu"
	"github.com/commit-run/commit-run/offload"
	"github.com/commit-run/commit-run/sim"
	"github.com/commit-run/commit-run/tokenizer"
)

// Model is an opened model. It is safe for concurrent use by many sessions.
type Model struct {
	opts Options
	file *models.File
	arch *models.Model
	tok  *tokenizer.Tokenizer
	dev  device.Device
	// Optional capabilities of dev, found once.
	charger device.Charger
	labeler device.Labeler
	info    Info
	nctx    int
	kvF16   bool
	devNote string             // how --device auto chose, and automatic placement
	plan    *AutoPlan          // automatic placement's decision (nil: none made)
	off     *offload.Offloader // nil unless Options.Offload
	// place is where the experts live and move: m.off when offloading, else the model's own.
	place  placement
	replay *replay    // the routing of a timing-only model (Options.TimingOnly), else nil
	commit *committer // nil unless Options.Commit or offloading with the Commit Router
	// commitDev weighs committed routing on the device (nil: the host reads the routing).
	commitDev *commitDevice
	drop      *multigpu.Dropper // capacity-aware token drop; nil unless Options.Drop
	// ep is the expert-parallel group this model is rank `rank` of; nil on one device.
	ep   *eprun.Group
	rank int
	// block runs the passes and their MoE layers: on m's device (localBlock), or spread
	// over the ranks of ep (epBlock). Chosen once, when the model is prepared.
	block  block
	fpOnce sync.Once
	fp     string
	// ops compute a pass besides the products: the device's own when resident (the pass's
	// activations and KV caches live on the device), else the host's.
	ops      device.Ops
	resident bool
	// fused are the device's fused operations for passes in its memory (nil: none), and
	// moeDev the MoE layers it routes and computes itself (a nil entry: routed on the host).
	fused     device.Fused
	moeDev    []*device.MoELayer
	moeDevErr error // why the first layer the device does not route is not
	// graphs replays captured decode steps on a device that captures them (nil: eager).
	graphs *stepGraphs
	// logitsHost is where passes in device memory read a session's row of logits back to
	// (nil on the host, whose passes write them where they are).
	logitsHost *hostLogits
	act        activations
	// hostArenas are the passes' arenas on the host, reused (any number of passes run at
	// once there).
	hostArenas sync.Pool
	// passMu makes passes one at a time in device memory, where their activations share one
	// reserve and the device runs one stream anyway, and under continuous batching, where a
	// prompt's pass and a batched step take turns.
	passMu sync.Mutex
	// batch merges the decode steps of concurrent sessions into one pass (Options.Parallel
	// above 1); nil: each session's pass is its own.
	batch      *batcher
	seqScratch []models.Seq // attend's, under passMu

	// mu guards the memory map: computations hold it for reading, Close for writing, so
	// closing the model never unmaps weights under a running forward pass.
	mu     sync.RWMutex
	closed bool
}

// ErrClosed is returned by calls on a closed model or session.
var ErrClosed = errors.New("engine: model is closed")

// Open memory-maps a GGUF file, checks it, and prepares it to run.
func Open(path string, opts Options) (*Model, error) {
	kvF16, err := checkOptions(opts)
	if err != nil {
		return nil, err
	}
	f, err := models.Open(path)
	if err != nil {
		return nil, err
	}
	return openFile(f, opts, kvF16)
}

// OpenFile prepares an opened file to run, as Open does a path's, and takes it over: the
// model closes it, or OpenFile does if it fails. A virtual file (models.NewVirtualFile, whose
// weights are address space that nothing backs) runs timing only (Options.TimingOnly).
func OpenFile(f *models.File, opts Options) (*Model, error) {
	kvF16, err := checkOptions(opts)
	if err != nil {
		f.Close()
		return nil, err
	}
	return openFile(f, opts, kvF16)
}

// checkOptions checks the options every model takes and returns whether the KV cache is F16.
func checkOptions(opts Options) (kvF16 bool, err error) {
	if opts.Threads < 0 || opts.Threads > 4096 {
		return false, fmt.Errorf("threads = %d: want 0 (all cores) to 4096", opts.Threads)
	}
	if opts.ContextLength < 0 || opts.ContextLength > MaxContextLength {
		return false, fmt.Errorf("context length %d: want 0 (model default) to %d", opts.ContextLength, MaxContextLength)
	}
	if opts.Parallel < 0 || opts.Parallel > MaxParallel {
		return false, fmt.Errorf("parallel sequences %d: want 1 to %d", opts.Parallel, MaxParallel)
	}
	if opts.GPURowWarps != 0 && !slices.Contains(cuda.RowWarpsChoices, opts.GPURowWarps) {
		return false, fmt.Errorf("GPU warps a row %d: want 0 or one of %v", opts.GPURowWarps, cuda.RowWarpsChoices)
	}
	switch strings.ToLower(opts.KVType) {
	case "", "f16":
		return true, nil
	case "f32":
		return false, nil
	}
	return false, fmt.Errorf("KV cache type %q: want f16 or f32", opts.KVType)
}

// openFile prepares an opened file to run, and closes it if that fails: it loads the
// model's description and tokenizer, makes the device, takes the options that shape a pass,
// places the weights and the activations on the device, and readies the passes.
func openFile(f *models.File, opts Options, kvF16 bool) (*Model, error) {
	opened := false
	defer func() {
		if !opened {
			f.Close()
		}
	}()
	arch, tok, err := loadFile(f, opts)
	if err != nil {
		return nil, err
	}
	dev, note, err := newDevice(opts)
	if err != nil {
		return nil, err
	}
	if opts, err = offloadBudget(opts, dev); err != nil {
		closeDevice(dev)
		return nil, err
	}
	m := &Model{opts: opts, file: f, arch: arch, tok: tok, dev: dev, kvF16: kvF16, devNote: note}
	// The returns below name no model: m, not the result, is what a failure closes.
	defer func() {
		if !opened {
			if m.off != nil {
				m.off.Close()
			}
			m.closeEP()
			closeDevice(dev)
		}
	}()
	m.charger, _ = dev.(device.Charger)
	m.labeler, _ = dev.(device.Labeler)
	m.info = models.Describe(f, arch)
	if opts.TimingOnly != nil {
		m.replay = newReplay(m)
	}
	m.nctx = opts.ContextLength
	if m.nctx == 0 {
		m.nctx = min(arch.Config.ContextLen, DefaultMaxContext)
		if m.nctx <= 0 {
			m.nctx = DefaultMaxContext
		}
	}
	if opts.Drop != nil {
		if m.drop, err = multigpu.NewDropper(*opts.Drop, arch.Config.Experts); err != nil {
			return nil, err
		}
	}
	if err := m.openCommit(); err != nil {
		return nil, fmt.Errorf("%s: %w", f.Path, err)
	}
	if err := m.allocate(); err != nil {
		return nil, err
	}
	if err := m.prepare(); err != nil {
		return nil, err
	}
	opened = true
	return m, nil
}

// loadFile reads the model's description and tokenizer from f, and checks the options that
// need no device.
func loadFile(f *models.File, opts Options) (*models.Model, *tokenizer.Tokenizer, error) {
	arch, err := models.Load(f)
	if err != nil {
		return nil, nil, err
	}
	tok, err := tokenizer.FromGGUF(f.KV)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: tokenizer: %w", f.Path, err)
	}
	if tok.VocabSize() > arch.Config.Vocab {
		return nil, nil, fmt.Errorf("%s: the tokenizer has %d tokens but token_embd has only %d rows", f.Path, tok.VocabSize(), arch.Config.Vocab)
	}
	if _, err := opts.HostRates.WithDefaults(); err != nil {
		return nil, nil, err
	}
	if err := checkTimingOnly(opts); err != nil {
		return nil, nil, err
	}
	return arch, tok, nil
}

// allocate takes the device memory of the weights and of a pass's activations: an automatic
// placement's first where the model does not fit, then expert parallelism's ranks, the
// offloader's slots (sized around the activations), or the whole model.
func (m *Model) allocate() error {
	path, dev := m.file.Path, m.dev
	m.resident = m.residentPasses()
	m.act.pass, m.act.layer = m.activationFloats()
	allocActivations := func() error {
		if err := dev.Memory().Alloc(m.act.bytes(), "activations"); err != nil {
			return fmt.Errorf("%s: one pass's activations (%d bytes for up to %d tokens) do not fit on %s: %w", path, m.act.bytes(), prefillBatch, dev.Name(), err)
		}
		return nil
	}
	if m.autoPlaces() {
		if err := m.placeAuto(); err != nil {
			return err // the candidates' runs name the file
		}
	}
	// Offloading sizes its slots around the activations, and says how large a budget must
	// be when it is too small for them: it goes first.
	offloaded := m.opts.EP == nil && m.opts.Offload != nil
	if !offloaded {
		if err := allocActivations(); err != nil {
			return err
		}
	}
	switch {
	case m.opts.EP != nil:
		if err := m.openEP(path); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
	case offloaded:
		var err error
		if m.off, err = newOffloader(m, *m.opts.Offload); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		return allocActivations()
	default:
		if err := dev.Memory().Alloc(m.info.NonExpertBytes+m.info.ExpertBytes, "the weights"); err != nil {
			return fmt.Errorf("%s: %.2f GiB of weights do not fit on %s (%.2f GiB): offload the experts to host memory with a device memory budget (--gpu-mem): %w",
				path, float64(m.info.NonExpertBytes+m.info.ExpertBytes)/(1<<30), dev.Name(), float64(dev.Memory().Budget())/(1<<30), err)
		}
	}
	return nil
}

// prepare readies the passes once the memory is taken: the experts' placement, the weights
// read once and uploaded, the device's operations (fused, committed routing, captured decode
// steps), and the batcher of parallel sequences.
func (m *Model) prepare() error {
	path, opts := m.file.Path, m.opts
	m.block = localBlock{m}
	if m.ep != nil {
		m.block = epBlock{m}
	}
	m.place = residentPlacement{m: m, commits: m.commit != nil && m.commit.compute}
	if m.off != nil {
		m.place = offloaderPlacement{m.off}
	}
	if m.replay == nil { // a timing-only model reads no weight
		m.file.Prefault(m.arch.Config.Skipped, opts.Progress)
	}
	if err := m.upload(); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if err := m.setupOps(); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if err := m.setupCommitDevice(); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if err := m.setupFused(); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if m.resident {
		m.logitsHost = newHostLogits(m.dev)
	}
	m.setupGraphs()
	if opts.Parallel > 1 && opts.EP != nil {
		return fmt.Errorf("%s: %d parallel sequences with expert parallelism: not supported yet (one sequence at a time)", path, opts.Parallel)
	}
	if opts.Parallel > 1 && m.replay == nil {
		m.batch = newBatcher(m, opts.Parallel)
	}
	return nil
}

// Inspect reads a GGUF file's metadata and weights' layout without preparing it to run.
func Inspect(path string) (*Info, error) {
	f, err := models.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return InspectFile(f)
}

// InspectFile describes an opened file as Inspect describes a path's; f stays open.
func InspectFile(f *models.File) (*Info, error) {
	arch, err := models.Load(f)
	if err != nil {
		return nil, err
	}
	info := models.Describe(f, arch)
	return &info, nil
}

// Info describes the model.
func (m *Model) Info() Info { return m.info }

// KVCacheBytes is the size of one session's KV cache: its context length's positions of
// every layer's keys and values, and the recurrent layers' states.
func (m *Model) KVCacheBytes() int64 { return kvCacheBytes(m) }

// kvCacheBytes is the size of one session's KV cache, without allocating it.
func kvCacheBytes(m *Model) int64 {
	// Where passes run in the device's memory (or would, on a simulated GPU), the snapshots
	// of recurrent states and sliding-window rings for prefix reuse live beside them there,
	// up to models.MaxSnapshots.
	_, simulated := m.dev.(*sim.Device)
	snaps := 0
	if m.resident || simulated && m.passesOnDevice() {
		snaps = models.MaxSnapshots
	}
	return models.CacheBytes(m.arch, m.kvOptions(), snaps)
}

// kvOptions is what a session's KV cache holds: the context, in passes of prefillBatch
// tokens at most (so that a sliding window's layers keep a ring).
func (m *Model) kvOptions() models.KVOptions {
	return models.KVOptions{Positions: m.nctx, MaxPass: prefillBatch, F16: m.kvF16}
}

// newOffloader makes the offloader of o for m: its slots take what the budget leaves beside
// the resident weights, the KV caches of the parallel sequences, the Commit Router and the
// activations.
func newOffloader(m *Model, o OffloadOptions) (*offload.Offloader, error) {
	seqs := max(m.opts.Parallel, 1)
	c := offload.Config{Model: m.arch, Device: m.dev, NonExpert: m.info.NonExpertBytes,
		KV: kvCacheBytes(m) * int64(seqs), Activations: m.act.bytes(), Sequences: seqs, Reserved: m.replay != nil}
	if m.commit != nil {
		c.Predictor = m.commit.bytes // already on the device
	}
	return offload.New(c, o)
}

// ResidentExperts lists the routed experts in the offloader's device slots now, by block
// index; ok is false when offloading is off (every expert is where the model keeps it).
func (m *Model) ResidentExperts() (resident map[int][]int, ok bool) {
	if m.off == nil {
		return nil, false
	}
	return m.off.Resident(), true
}

// Offload reports the offloader's statistics; ok is false when offloading is off.
func (m *Model) Offload() (OffloadStats, bool) {
	if m.off == nil {
		return OffloadStats{}, false
	}
	s := m.off.Stats()
	mem := m.dev.Memory()
	s.PeakDeviceMem, s.DeviceMemLimit = mem.Peak(), mem.Budget()
	return s, true
}

// ContextLength returns the positions each session's KV cache holds.
func (m *Model) ContextLength() int { return m.nctx }

// KVType is the KV cache's element type: f16 or f32.
func (m *Model) KVType() string {
	if m.kvF16 {
		return "f16"
	}
	return "f32"
}

// Tokenize turns text into token ids; addSpecial adds BOS/EOS as the model's metadata says.
// Special tokens written in the text (like <|im_end|>) are recognised.
func (m *Model) Tokenize(text string, addSpecial bool) ([]int32, error) {
	return m.tok.Encode(text, addSpecial, true)
}

// Detokenize turns token ids into text.
func (m *Model) Detokenize(ids []int32) string { return m.tok.Decode(ids) }

// MaxTokenBytes bounds the bytes of text one token stands for: a text of n bytes is at least
// n/MaxTokenBytes tokens, so that a text far beyond the context is refused before it is
// tokenized.
func (m *Model) MaxTokenBytes() int { return m.tok.MaxTokenBytes() }

// Close frees the model. Sessions still open fail with ErrClosed afterwards.
func (m *Model) Close() error {
	if m.batch != nil {
		m.batch.stop() // before the lock: its step in flight holds it for reading
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	m.closed = true
	if m.off != nil {
		m.off.Close()
	}
	m.graphs.close()
	return errors.Join(m.closeEP(), closeDevice(m.dev), m.file.Close())
}

// FirstTokens returns the text of text's first n tokens (all of it when it has no more).
func (m *Model) FirstTokens(text string, n int) (string, error) {
	if n < 0 {
		return "", fmt.Errorf("max tokens %d: want 0 (all) or more", n)
	}
	ids, err := m.tok.Encode(text, false, false)
	if err != nil {
		return "", err
	}
	if n == 0 || n >= len(ids) {
		return text, nil
	}
	return m.tok.Detokenize(ids[:n], false, false), nil
}
