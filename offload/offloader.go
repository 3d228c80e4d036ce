package offload

import (
	"fmt"
	"slices"
	"sync"

	"github.com/commit-run/commit-run/device"
	"github.com/commit-run/commit-run/models"
)

// Options turn on expert offloading: the routed experts live in a host store and are
// copied into a fixed set of device slots as the policy decides; everything else stays
// resident. On the CPU device the "device" is a budgeted region of host memory, which is
// what proves the pipeline moves the right bytes: the logits must not change.
type Options struct {
	Policy Policy
	// GPUMem is the device memory budget in bytes: resident weights, one session's KV cache
	// and the expert slots must fit in it. The engine takes 0 as the card's whole memory
	// (a GPU's free memory, a simulated card's size).
	GPUMem   int64
	Eviction Eviction
	// Predictor names what prefetch and commit predict the next layer's experts with:
	// router, the learnt Commit Router (commit's default; see CommitOptions), or prev-token
	// (prefetch's default) or frequency, heuristics that need no training; commit also takes
	// oracle, which computes with the router's own choice (the numbers of ondemand).
	Predictor string
	// HostLayers is static's N: the first N MoE layers' experts stay in host memory and the
	// host computes them (llama.cpp's --n-cpu-moe N).
	HostLayers int
}

// Stats count what the offloader did since the model was opened.
type Stats struct {
	Slots        int
	SlotBytes    int64
	Resident     int64 // non-expert weights and one session's KV cache
	Hits, Misses int64 // experts found in a slot, or copied in when needed
	Prefetched   int64 // experts copied ahead of their layer
	OnCPU        int64 // experts computed from host memory (cpu-miss, static)
	HostBytes    int64 // the weight bytes of those experts, which the host read
	BytesCopied  int64
	// NeededBytes are the bytes of the experts computed on the device that were not resident
	// when their forward pass began: what any schedule would have had to move.
	NeededBytes int64
	// Predicted counts the experts prefetch predicted for a single-token pass, Correct those
	// the router then chose.
	Predicted, Correct int64
	PeakDeviceMem      int64
	DeviceMemLimit     int64
}

// An Offloader serves a model's routed experts from device slots, or from host memory where
// its policy has the host compute them: the step "place" of the engine's MoE block. One per
// model, shared by its sessions; its methods are called in a pass's order, layer by layer.
type Offloader struct {
	mu    sync.Mutex
	opts  Options
	pol   strategy
	store *Store
	cache *Cache
	slots [][]byte
	dev   device.Device
	// planner, when the device has one, decides cpu-miss per expert: compute on the host or
	// copy, whichever finishes first.
	planner device.Planner
	ready   map[ExpertKey]device.Event // when an expert's copy into its slot lands
	landsAt map[ExpertKey]float64      // and when the planner expected it to
	free    map[int]device.Event       // when the last kernel reading a slot ends
	// pass numbers forward passes; loadedIn is the pass each expert was last copied in, so
	// that one copied during the current pass was not resident at its start.
	pass     uint64
	loadedIn map[ExpertKey]uint64
	moeIdx   map[int]int   // block index -> MoE layer number
	next     map[int]int   // MoE block -> the next MoE block (-1 for the last)
	last     map[int][]int // MoE block -> the experts it chose last (prev-token)
	counts   map[int][]int // MoE block -> how often it chose each expert (frequency)
	pending  map[int][]int // MoE block -> the experts prefetched for its next pass
	prompt   bool          // the pass routes several tokens of a prompt: its experts are demoted after use
	// decodeBatch: the pass routes the next token of several sequences, not a prompt's
	// (see scanning). footprint counts the experts the pass has acquired, lastFootprint
	// those of the last decode batch.
	decodeBatch              bool
	footprint, lastFootprint int
	kept                     map[ExpertKey]bool // experts pinned in their slots for good (static's device layers)
	stats                    Stats
	virtual                  []byte // a timing-only run's slots, reserved but never written
}

// Close gives back what the offloader holds beyond Go memory.
func (f *Offloader) Close() {
	models.VirtualFree(f.virtual)
	f.virtual, f.slots = nil, nil
	f.store.Close()
}

// Config is what an Offloader serves and what else its device holds: the budget's other
// tenants, which the slots must leave room for.
type Config struct {
	Model  *models.Model
	Device device.Device
	// NonExpert are the model's resident weights; KV the KV caches of Sequences sequences;
	// Predictor the Commit Router's weights, already on the device; Activations one pass's
	// activations, which the engine allocates after the slots.
	NonExpert, KV, Predictor, Activations int64
	Sequences                             int
	// Reserved is a timing-only run's: the slots are address space that nothing backs, and
	// no byte is copied.
	Reserved bool
}

// New sizes the slots from o's budget, which must hold the resident weights, the KV caches
// and at least one layer's top-k (two layers' for prefetch), and prepares them as o's policy
// does.
func New(c Config, o Options) (*Offloader, error) {
	moeLayers := 0
	for _, l := range c.Model.Layers {
		if l.MoE != nil {
			moeLayers++
		}
	}
	pol, err := newStrategy(&o, moeLayers)
	if err != nil {
		return nil, err
	}
	var so StoreOptions
	if h, ok := c.Device.(device.HostAllocator); ok {
		so.Alloc = h.HostAlloc // page-locked: copies run at the link's speed, asynchronously
	}
	so.Reserved = c.Reserved // a timing-only run copies no bytes
	store, err := NewStore(c.Model, so)
	if err != nil {
		return nil, err
	}
	f := &Offloader{opts: o, pol: pol, store: store, dev: c.Device, moeIdx: map[int]int{}, next: map[int]int{},
		last: map[int][]int{}, counts: map[int][]int{}, pending: map[int][]int{}, ready: map[ExpertKey]device.Event{}, landsAt: map[ExpertKey]float64{}, free: map[int]device.Event{},
		loadedIn: map[ExpertKey]uint64{}}
	opened := false
	defer func() {
		if !opened { // give back what the reservations took
			models.VirtualFree(f.virtual)
			store.Close()
		}
	}()
	f.planner, _ = c.Device.(device.Planner)
	layers := store.Layers()
	for i, l := range layers {
		f.moeIdx[l] = i
		f.next[l] = -1
		if i+1 < len(layers) {
			f.next[l] = layers[i+1]
		}
	}
	if err := f.allocSlots(c, o); err != nil {
		return nil, err
	}
	if err := pol.prepare(f); err != nil {
		return nil, err
	}
	opened = true
	return f, nil
}

// allocSlots gives the slots what the budget leaves beside the resident tenants, and at
// least what the policy needs.
func (f *Offloader) allocSlots(c Config, o Options) (err error) {
	m, layers := c.Model, f.store.Layers()
	resident := c.NonExpert + c.KV + c.Predictor + c.Activations
	need := f.pol.minSlots(len(layers), m.Config.Experts, m.Config.ExpertsUsed, o.Predictor)
	slot := f.store.SlotBytes()
	free := o.GPUMem - resident
	n := int(max(free, 0) / slot)
	if n < need {
		return fmt.Errorf("offload: a %d-byte device budget is too small: the resident weights (%d bytes), %s (%d bytes), the Commit Router (%d bytes) and one pass's activations (%d bytes) leave room for %d expert slots of %d bytes, policy %s needs %d: at least %d bytes",
			o.GPUMem, c.NonExpert, kvCachesOf(c.Sequences), c.KV, c.Predictor, c.Activations, n, slot, o.Policy, need, resident+int64(need)*slot)
	}
	n = min(n, m.Config.Experts*len(layers))
	mem := f.dev.Memory()
	if err := mem.Alloc(c.NonExpert, "resident weights"); err != nil {
		return err
	}
	if err := mem.Alloc(int64(n)*slot, "expert slots"); err != nil {
		mem.Free(c.NonExpert)
		return err
	}
	if f.cache, err = NewCache(n, o.Eviction); err != nil {
		return err
	}
	f.slots = make([][]byte, n)
	res, _ := f.dev.(device.Resident)
	if c.Reserved {
		// Nothing is copied into a timing-only run's slots: reserve their addresses only.
		if f.virtual, err = models.VirtualAlloc(int64(n)*slot, "expert slots"); err != nil {
			return err
		}
	}
	for i := range f.slots {
		switch {
		case f.virtual != nil:
			f.slots[i] = f.virtual[int64(i)*slot : int64(i+1)*slot : int64(i+1)*slot]
		case res == nil:
			f.slots[i] = make([]byte, slot)
		default:
			if f.slots[i], err = res.Buffer(slot, fmt.Sprintf("expert slot %d", i)); err != nil {
				return err
			}
		}
	}
	f.stats.Slots, f.stats.SlotBytes, f.stats.Resident = n, slot, resident
	return nil
}

// kvCachesOf names the KV caches of n sequences.
func kvCachesOf(n int) string {
	if n == 1 {
		return "one session's KV cache"
	}
	return fmt.Sprintf("the KV caches of %d parallel sequences", n)
}

// Predicted takes the experts predicted for layer's pass, learnt (the Commit Router's) or
// else the heuristic's made when the layer before was enqueued, and returns them and, for
// commit at batch size 1, the experts to compute with instead of the router's (nil: use the
// router's). used is the layer's experts per token.
func (f *Offloader) Predicted(layer int, learnt []int, T, used int) (pred, commit []int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	pred = f.pending[layer]
	delete(f.pending, layer)
	if learnt != nil {
		pred = learnt
	}
	if T == 1 && f.pol.commits() && len(pred) == used {
		commit = pred
	}
	return pred, commit
}

// Routed notes the experts the router chose for each of a layer's tokens, chosen[t] for token
// t (for the prediction heuristics) and, at batch size 1, scores the prediction pred made for
// it. Unless the pass committed, the host then reads the routing, to issue the loads of the
// experts that miss.
func (f *Offloader) Routed(layer int, chosen [][]int, pred []int, committed bool) {
	if !committed {
		f.dev.Sync(f.dev.Compute().Record())
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.prompt = len(chosen) > 1 && !f.decodeBatch
	if len(chosen) == 1 {
		for _, e := range pred {
			f.stats.Predicted++
			if slices.Contains(chosen[0], e) {
				f.stats.Correct++
			}
		}
	}
	// prev-token predicts from the last token's choice, frequency from every token's.
	f.last[layer] = slices.Clone(chosen[len(chosen)-1])
	c := f.counts[layer]
	if c == nil {
		c = make([]int, f.store.Experts(layer))
		f.counts[layer] = c
	}
	for _, ex := range chosen {
		for _, e := range ex {
			c[e]++
		}
	}
}

// chosen is how often the router has chosen k, over every token since the model opened; f's
// lock is held.
func (f *Offloader) chosen(k ExpertKey) int {
	if c := f.counts[k.Layer]; k.Expert < len(c) {
		return c[k.Expert]
	}
	return 0
}

// BeginPass starts a forward pass: what is resident now is what the pass does not have to
// move (the physical limit's bytes, DESIGN.md §6).
func (f *Offloader) BeginPass(decodeBatch bool) {
	f.mu.Lock()
	f.pass++
	if f.prompt {
		f.cache.Restore() // the prompt's demotions served its own pass only
		f.prompt = false
	}
	if f.decodeBatch {
		f.lastFootprint = f.footprint
	}
	f.decodeBatch, f.footprint = decodeBatch, 0
	f.mu.Unlock()
}

// scanning says whether the current pass, a decode batch, goes through more experts than
// half the slots hold (as the last batch did): then a pass's experts are a cyclic scan that
// LRU serves worst, since each layer's misses evict the experts its layer used a pass ago,
// which it is about to want again. An expert copied in for such a pass is demoted after use,
// so that the next misses take its slot and not a resident one's: the experts that stay
// resident keep serving hits, and the misses go through the slots they leave. f's lock is
// held.
func (f *Offloader) scanning() bool {
	return f.decodeBatch && 2*f.lastFootprint > len(f.slots)
}

// OnHost says which of a layer's experts the policy computes on the host (nil: none).
func (f *Offloader) OnHost(layer int, experts, tokens []int) []bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.pol.onHost(f, layer, experts, tokens)
}

// HostsLayer says whether OnHost may put any of layer's experts on the host under the
// policy: never under ondemand, only in their host layers under the splits.
func (f *Offloader) HostsLayer(layer int) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.pol.hostsLayer(f, layer)
}

// expertWork is the host's work for expert w on a batch of tokens: its three products.
func expertWork(w ExpertWeights, tokens int) device.HostWork {
	return device.HostWork{}.Plus(w.Gate, tokens).Plus(w.Up, tokens).Plus(w.Down, tokens)
}

// hostBatch is a layer's host work with expert w on a batch of tokens added to work, that of
// the n experts already put on the host: their products, in the parallel regions the engine
// computes n+1 experts in (expertRegions).
func hostBatch(work device.HostWork, w ExpertWeights, tokens, n int) device.HostWork {
	next := work.Add(expertWork(w, tokens))
	next.Kernels = expertRegions(n + 1)
	return next
}

// expertRegions is how many parallel regions, each a host kernel's fixed cost
// (device.HostRates.Overhead), the engine's hostExperts computes n experts of a layer
// in: all their gate and up products in one device.Batcher region and all their downs in
// another, one expert's as several's.
func expertRegions(n int) int {
	return 2 * min(n, 1)
}

// Weights returns expert e of layer's weights. On the device (host false), they are in its
// slot, copied in if it missed, pinned until done is called, and the compute stream waits
// for the copy. For an expert OnHost put on the host they are the host store's. One expert
// at a time, so a batch that needs more experts than there are slots still runs.
func (f *Offloader) Weights(layer, e int, host bool) (w ExpertWeights, done func() error, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := ExpertKey{Layer: layer, Expert: e}
	if host {
		// The host computes it from its own memory: the same bytes, so the same numbers.
		if w, err = f.store.Expert(k); err != nil {
			return w, nil, err
		}
		f.stats.OnCPU++
		f.stats.Misses++
		f.stats.HostBytes += int64(len(w.Gate.Data) + len(w.Up.Data) + len(w.Down.Data))
		if f.pol.copiesBehind(f, k) {
			// The slot fills behind the computation, so that later tokens find it resident.
			if _, _, err := f.load(k); err != nil {
				return w, nil, err
			}
		}
		return w, func() error { return nil }, nil
	}
	lay, err := f.store.Layout(layer)
	if err != nil {
		return w, nil, err
	}
	slot, hit, err := f.load(k)
	if err != nil {
		return w, nil, err
	}
	if err := f.cache.Pin(k); err != nil {
		return w, nil, err
	}
	f.footprint++
	demote := f.prompt || !hit && f.scanning()
	if hit {
		f.stats.Hits++
	} else {
		f.stats.Misses++
	}
	if f.loadedIn[k] == f.pass {
		// Copied during this pass: a schedule had to move it, its own bytes (a slot fits the
		// largest expert). A pass acquires each expert of a layer once, so it is counted once.
		r, err := f.store.Region(k)
		if err != nil {
			return w, nil, err
		}
		f.stats.NeededBytes += int64(len(r))
	}
	f.dev.Compute().Wait(f.ready[k])
	return lay.View(f.slots[slot]), func() error {
		f.mu.Lock()
		defer f.mu.Unlock()
		// The slot may be overwritten once the kernels enqueued so far are done.
		f.free[slot] = f.dev.Compute().Record()
		if demote {
			// A prompt's pass goes through every layer once, using most of each layer's
			// experts: the ones it has used are the ones it no longer needs, and under LRU
			// the later layers' experts, which it is about to use, would go first. A large
			// decode batch's misses likewise (scanning).
			f.cache.Demote(k)
		}
		return f.cache.Unpin(k)
	}, nil
}

// Pinnable is the slots not pinned for good (static's device layers): the experts Weights
// can hold at once besides those Kept.
func (f *Offloader) Pinnable() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.slots) - len(f.kept)
}

// Kept says whether expert e of layer stays in its slot for good (static's device layers):
// Weights holds it without taking a slot from Pinnable's.
func (f *Offloader) Kept(layer, e int) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.kept[ExpertKey{Layer: layer, Expert: e}]
}

// KeptWeights returns expert e of layer's weights in its slot where the expert is Kept (false
// where not): the slot is its own for the offloader's life and its copy has landed, so a
// device may record where the weights lie and route the layer itself (the engine's device
// routing of static's device layers).
func (f *Offloader) KeptWeights(layer, e int) (ExpertWeights, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := ExpertKey{Layer: layer, Expert: e}
	if !f.kept[k] {
		return ExpertWeights{}, false, nil
	}
	slot, ok := f.cache.Lookup(k)
	if !ok {
		return ExpertWeights{}, false, fmt.Errorf("offload: kept expert %d of layer %d has no slot", e, layer)
	}
	lay, err := f.store.Layout(layer)
	if err != nil {
		return ExpertWeights{}, false, err
	}
	return lay.View(f.slots[slot]), true, nil
}

// DeviceRouted counts n experts that the device chose and computed from their slots by
// itself (KeptWeights): hits the host never saw.
func (f *Offloader) DeviceRouted(n int) {
	f.mu.Lock()
	f.stats.Hits += int64(n)
	f.mu.Unlock()
}

// Holds says whether expert e of layer has a slot now (its copy landed or on its way):
// Weights serves it without a copy or an eviction.
func (f *Offloader) Holds(layer, e int) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.cache.Lookup(ExpertKey{Layer: layer, Expert: e})
	return ok
}

// load makes k resident, or on its way on the copy stream, and returns its slot. A slot is
// overwritten in place once the kernels reading its old expert are done.
func (f *Offloader) load(k ExpertKey) (int, bool, error) {
	slot, hit, _, _, err := f.cache.Assign(k)
	if err != nil {
		return 0, false, fmt.Errorf("offload: %w", err)
	}
	if !hit {
		r, err := f.store.Region(k)
		if err != nil {
			return 0, false, err
		}
		if f.planner != nil {
			f.landsAt[k] = f.planner.CopyDone(int64(len(r)))
		}
		cp := f.dev.Copy()
		cp.Wait(f.free[slot])
		if l, ok := f.dev.(device.Labeler); ok {
			l.Label("copy", fmt.Sprintf("L%d E%d", k.Layer, k.Expert))
		}
		f.dev.CopyIn(f.slots[slot], r)
		f.ready[k] = cp.Record()
		f.loadedIn[k] = f.pass
		if f.cache.Eviction() == LFU {
			// Its uses so far, not one: it was chosen before it had a slot, and an expert a
			// prompt copied in for its batch should not evict one every token uses.
			if err := f.cache.SetUses(k, uint64(f.chosen(k))); err != nil {
				return 0, false, err
			}
		}
		f.stats.BytesCopied += int64(len(r))
	}
	return slot, hit, nil
}

// Ahead loads the experts predicted for the MoE layer after layer (the same token's next
// layer, or the next token's first), after layer's experts are enqueued: learnt, the Commit
// Router's prediction for block nextLayer, which the host reads once event ready says it is
// computed; or else the heuristic's, from what that layer chose before, which never looks
// ahead.
func (f *Offloader) Ahead(layer int, k int, nextLayer int, learnt []int, ready device.Event) error {
	if learnt != nil {
		f.dev.Sync(ready)
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, e := range learnt {
			if _, hit, err := f.load(ExpertKey{Layer: nextLayer, Expert: e}); err != nil {
				return err
			} else if !hit {
				f.stats.Prefetched++
			}
		}
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.Heuristic() {
		return nil
	}
	next := f.next[layer]
	if next < 0 {
		next = f.store.Layers()[0]
	}
	var pred []int
	if f.opts.Predictor == "frequency" {
		if c := f.counts[next]; c != nil {
			pred = MostUsed(c, k)
		}
	} else {
		pred = f.last[next]
		pred = pred[:min(len(pred), k)]
	}
	f.pending[next] = slices.Clone(pred)
	for _, e := range pred {
		if _, hit, err := f.load(ExpertKey{Layer: next, Expert: e}); err != nil {
			return err
		} else if !hit {
			f.stats.Prefetched++
		}
	}
	return nil
}

// Heuristic says whether the policy loads the next layer's experts from a heuristic's
// prediction: prefetch and commit with prev-token or frequency (the oracle commits to the
// router's own choice; the Commit Router's predictions come from the engine).
func (f *Offloader) Heuristic() bool {
	return f.pol.loadsAhead() && f.opts.Predictor != "oracle" && f.opts.Predictor != "router"
}

// Stats reports what the offloader did since it was made.
func (f *Offloader) Stats() Stats {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stats
}

// Resident lists the experts in the device slots now, by MoE block: what a live view of the
// cache draws.
func (f *Offloader) Resident() map[int][]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[int][]int{}
	for _, k := range f.cache.Resident() {
		out[k.Layer] = append(out[k.Layer], k.Expert)
	}
	for _, ex := range out {
		slices.Sort(ex)
	}
	return out
}

// Options are the options it runs with, its predictor defaulted as its policy does.
func (f *Offloader) Options() Options { return f.opts }

// Commits says whether its policy computes a single-token pass with the predicted experts.
func (f *Offloader) Commits() bool { return f.pol.commits() }

// Planner is what weighs the host against a copy: the device's own, nil on a device that
// cannot tell (the CPU), or the one UsePlanner set.
func (f *Offloader) Planner() device.Planner { return f.planner }

// UsePlanner weighs the host against a copy with p instead of the device's planner (nil:
// never weigh), as the runs that study the weighing do.
func (f *Offloader) UsePlanner(p device.Planner) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.planner = p
}
