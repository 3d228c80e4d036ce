// Package device defines what the engine needs from a place to compute: memory with a hard
// budget, a compute stream and a copy stream ordered by events, and the kernels the models
// use. Devices know nothing of offloading: the engine and offload/ decide what lives where and when
// it moves; a device only moves bytes, runs kernels and keeps time.
//
// The core interface is small. What only some devices can do is found by type assertion, the
// way database/sql/driver does it: a Clock (virtual or measured time), a Charger (work the
// engine computes itself, such as attention over the cache, priced on the compute stream) and
// a Planner (when a copy or a host computation started now would finish, for cpu-miss).
package device

import (
	"github.com/commit-run/commit-run/quant"
)

// Kernels are the computations the models and the engine ask of a device. Implementations
// are safe for concurrent use: several sessions compute at once.
type Kernels interface {
	// MatMul computes out[t*w.Rows+o] = dot(w row o, x[t*w.Cols:(t+1)*w.Cols]) for t < T.
	MatMul(w quant.Matrix, x []float32, T int, out []float32)
	// MatMulID is MatMul for a routed expert's matrix (llama.cpp's MUL_MAT_ID, whose
	// kernels differ from MUL_MAT's for some weight types).
	MatMulID(w quant.Matrix, x []float32, T int, out []float32)
	// Parallel calls fn(i) for every i in [0, n), spread across the device's threads, and
	// returns when all calls have returned.
	Parallel(n int, fn func(i int))
}

// Event is a point in a stream's work that other streams and the host can wait for, as a
// recorded CUDA event. Its concrete type belongs to the device that recorded it; nil has
// always happened.
type Event any

// Stream is an in-order queue of device work.
type Stream interface {
	// Record returns an event that happens when the work enqueued so far is done.
	Record() Event
	// Wait makes the stream's later work start after ev.
	Wait(ev Event)
}

// Device is a place to compute. Kernels run on its compute stream in call order; CopyIn
// runs on its copy stream; the host thread orders them with events.
type Device interface {
	Kernels
	// Name is how users select the device: "cpu", "sim:rtx4090", "cuda:0".
	Name() string
	// Memory is the device's memory budget. Everything placed on the device is allocated
	// from it, so its peak is the device's peak.
	Memory() *Memory
	// Compute is the stream kernels run on.
	Compute() Stream
	// Copy is the stream CopyIn runs on.
	Copy() Stream
	// CopyIn copies host bytes src to device bytes dst (of the same length) on the copy
	// stream. dst may be read by kernels only after the compute stream waits for an event
	// recorded on the copy stream after the call.
	CopyIn(dst, src []byte)
	// Sync blocks the host until ev has happened: the host reads a result of the device.
	Sync(ev Event)
	// Host is the host CPU, for work the engine chooses to compute there instead of moving
	// its weights (cpu-miss). Its kernels run in call order on its own stream.
	Host() HostKernels
}

// HostKernels are the host CPU's kernels, seen from a device: a stream of their own, so that
// the device can wait for what the host computed.
type HostKernels interface {
	Kernels
	Stream
}

// Clock is implemented by devices that keep time the engine should report instead of the
// wall clock: the simulator's virtual time.
type Clock interface {
	// Now is the host thread's time in seconds since the device was made.
	Now() float64
}

// Charger is implemented by devices that price work by its size. The engine computes some
// small operations itself (norms, attention over the KV cache, the routing softmax) and
// charges them here so that the device's time sees them.
type Charger interface {
	// Charge adds a kernel of the given kind that reads or writes bytes and performs flops
	// to the compute stream, after the work enqueued before it.
	Charge(kind string, bytes, flops float64)
}

// Planner is implemented by devices that can tell when work started now would finish, which
// is what cpu-miss's per-expert cost model compares.
type Planner interface {
	// CopyDone is when a copy of n bytes enqueued now on the copy stream would land.
	CopyDone(n int64) float64
	// HostDone is when the host would finish work w started now.
	HostDone(w HostWork) float64
}

// Labeler is implemented by devices that keep a timeline: the engine names the work it
// enqueues next (kind "expert", label "L3 E5") so that a picture of the streams says what
// each span is. A device without one ignores labels.
type Labeler interface {
	// Label names the kernels and copies enqueued next, until the next Label call.
	Label(kind, label string)
}

// Linker is implemented by devices that model their link to other devices in virtual time,
// so that a collective among several simulated devices takes the time their interconnect
// would. Devices whose time is the wall clock have no Linker: their collectives take what
// they take.
type Linker interface {
	// Ready is when the device can start a collective: the work issued to its compute
	// stream so far is done and its host has issued the call.
	Ready() float64
	// Transfer occupies the device's link from start to end with the collective named by
	// the last Label, and makes the compute stream's later work wait for its end.
	Transfer(start, end float64)
}

// Resident is implemented by devices with memory of their own, apart from the host's: a real
// GPU. The engine hands them the weights that stay on the device before the first pass, and
// takes device buffers (expert slots) from them. Handles stay byte slices so that the rest of
// the engine is the same on every device: a buffer's slice reserves host addresses but no
// memory, the host never reads or writes it, and the device's kernels and CopyIn translate it
// to the device memory it stands for.
type Resident interface {
	// Upload copies b, weights in host memory, to the device and keeps them there: kernels
	// given a matrix that lies in b read the device's copy. what names it in errors.
	Upload(b []byte, what string) error
	// Buffer allocates n bytes of device memory.
	Buffer(n int64, what string) ([]byte, error)
	// Release frees a Buffer, or the device's copy of an Upload of exactly b, once the work
	// enqueued so far is done with it.
	Release(b []byte)
}

// HostAllocator is implemented by devices that copy faster from memory they allocate on the
// host (page-locked memory, for a GPU): the expert store is allocated with it.
type HostAllocator interface {
	// HostAlloc returns n bytes of host memory that live as long as the device.
	HostAlloc(n int64) ([]byte, error)
}

// Faulter is implemented by devices whose kernels and copies can fail after the call that
// enqueued them returned, as a GPU's do: the engine checks it after each forward pass.
type Faulter interface {
	// Err is the first failure, which stays: a GPU's errors are sticky.
	Err() error
}

// GatingFunc is how a MoE router's logits become expert probabilities (models.Gating).
type GatingFunc int

const (
	GatingSoftmax       GatingFunc = iota // softmax over every expert
	GatingSigmoid                         // each logit's sigmoid
	GatingSoftmaxWeight                   // the chosen experts' weights are a softmax over their logits
)

// Gating is a MoE router's gating as a Committer computes it: the engine's route (llama.cpp
// build_moe_ffn).
type Gating struct {
	Func GatingFunc
	// Bias is added to the probabilities to select the top-k (device memory), or nil.
	Bias []float32
	// Normalize renormalises the chosen weights to sum to 1; Scale, when not 0, multiplies
	// them.
	Normalize bool
	Scale     float32
	// Groups > 1 limits the choice to the GroupsUsed best of that many equal groups of
	// experts, a group scoring the sum of its two best selection scores (DeepSeek-V3's
	// group-limited routing, models.MoE.Groups).
	Groups, GroupsUsed int
}

// OWA is Output Weight Adjustment's settings (package owa's Params) for a Committer; On false
// turns it off.
type OWA struct {
	On                     bool
	Alpha1, Alpha2         float64
	MinCorrect, MaxCorrect int
}

// CommitMaxExperts, CommitMaxUsed and CommitMaxGroups bound the router a Committer weighs:
// experts per layer, experts per token and expert groups (Gating.Groups).
const (
	CommitMaxExperts = 512
	CommitMaxUsed    = 16
	CommitMaxGroups  = 64
)

// Committer is implemented by devices that compute committed routing in their own memory (a
// GPU), so that the host enqueues a token's committed experts, and their weighted sum,
// without reading the router's logits first: the synchronisation CommitMoE's commitment
// exists to remove. The host reads what it needs for its statistics later, with ReadAsync.
type Committer interface {
	// CommitWeights enqueues the committed routing of one token: from its router's logits
	// (device memory, at most CommitMaxExperts) and the gating g, the router's own top-k, and
	// the mixing weights of the predicted experts pred (host memory, at most CommitMaxUsed,
	// as many as the top-k) into w (device, len(pred) floats): OWA's when o is on and
	// triggers, else the router's probabilities of pred through the gating. rec (device,
	// len(pred)+1 floats) receives the router's top-k experts' indices and then 1 if OWA
	// applied, else 0.
	CommitWeights(logits []float32, g *Gating, pred []int32, o OWA, w, rec []float32)
	// CombineOne is Ops.Combine for one row whose weights are in device memory: out =
	// sum over j of w[j] times row j of ys, in j order.
	CombineOne(out, ys, w []float32, d int)
	// ReadAsync enqueues a copy of device floats src to host memory dst (from HostAlloc, so
	// that the copy does not hold the host) on the compute stream and returns the event
	// after which dst holds them.
	ReadAsync(dst, src []float32) Event
}
