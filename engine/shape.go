package engine

import "github.com/commit-run/commit-run/offload"

// Shape prices one decode token of the model for the offloading timing model
// (offload.FileShape): every tensor's bytes and flops sorted into attention, router, shared
// experts, dense FFN, head and routed experts, with the attention reading an F16 KV cache
// filled to ctxFill positions. Resident is what the offloading engine keeps on a GPU: every
// non-expert weight, a session's KV cache and one pass's activations.
func (m *Model) Shape(ctxFill int) (*offload.Shape, error) {
	src := offload.FileSource{File: m.file, Arch: m.arch, Name: m.info.Name, Architecture: m.info.Architecture,
		Path: m.info.Path, KVBytes: float64(kvCacheBytes(m))}
	if m.passesOnDevice() {
		pass, layer := m.gpuActivationFloats()
		src.Activations = 4 * float64(pass+layer)
	}
	return offload.FileShape(src, ctxFill)
}
