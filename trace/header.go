package trace

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"time"
)

// InputFormat says whether and how a trace stores router inputs.
type InputFormat string

const (
	InputsNone InputFormat = "none" // the empty string means the same
	InputsF16  InputFormat = "f16"  // binary16, rounded to nearest even; half the bytes of f32
	InputsF32  InputFormat = "f32"
)

// width is the bytes per stored input element.
func (f InputFormat) width() (int, error) {
	switch f {
	case InputsNone, "":
		return 0, nil
	case InputsF16:
		return 2, nil
	case InputsF32:
		return 4, nil
	}
	return 0, fmt.Errorf("inputs %q: want none, f16 or f32", string(f))
}

// Header describes a trace: the model's routing shape and what each token stores. It is
// stored as JSON at the start of the file (see the package documentation for the keys).
type Header struct {
	Model       string `json:"model"`
	Arch        string `json:"arch"`
	ModelSHA256 string `json:"model_sha256,omitempty"` // of the model file; optional
	// Fingerprint is the model's routing fingerprint (engine.Model.Fingerprint: SHA-256 of
	// its routers and token embedding), optional: what a Commit Router trained on the trace
	// is bound to, cheap to check without hashing a many-gigabyte file.
	Fingerprint string `json:"fingerprint,omitempty"`
	Layers      int    `json:"layers"`     // block count
	MoELayers   []int  `json:"moe_layers"` // block indices that route, increasing
	Experts     int    `json:"experts"`    // routed experts per MoE layer
	Used        int    `json:"used"`       // experts chosen per token (top-k)
	Embd        int    `json:"embd"`       // router input width
	// Inputs says whether and how router inputs are stored; Logits whether router logits are
	// (always f32: they are the trainer's target, and the softmax amplifies rounding).
	Inputs  InputFormat `json:"inputs"`
	Logits  bool        `json:"logits"`
	Source  string      `json:"source,omitempty"`  // free text: text file, prompt set
	Created string      `json:"created,omitempty"` // RFC 3339; optional
	// Synthetic marks routing drawn from a synthetic router rather than recorded from a
	// model, so that figures made from it can say so.
	Synthetic bool `json:"synthetic"`
}

// normalized returns a copy with the defaults spelled out and MoELayers owned by the copy.
func (h Header) normalized() Header {
	if h.Inputs == "" {
		h.Inputs = InputsNone
	}
	h.MoELayers = slices.Clone(h.MoELayers)
	return h
}

// layout is what a header implies for the bytes of a token record.
type layout struct {
	moe                   []int
	experts, used, embd   int
	inputWidth            int // bytes per input element: 0, 2 or 4
	logits                bool
	layerBytes, tokenSize int
}

// layout validates h and derives the record layout. Every bound here protects a reader
// from a header that would make it allocate absurdly or overflow the record size.
func (h *Header) layout() (layout, error) {
	iw, err := h.Inputs.width()
	if err != nil {
		return layout{}, err
	}
	switch {
	case h.Layers < 1 || h.Layers > maxLayers:
		return layout{}, fmt.Errorf("layers %d: want 1..%d", h.Layers, maxLayers)
	case len(h.MoELayers) == 0:
		return layout{}, fmt.Errorf("no MoE layers")
	case h.Experts < 1 || h.Experts > maxExperts:
		return layout{}, fmt.Errorf("experts %d: want 1..%d (ids are stored as u16)", h.Experts, maxExperts)
	case h.Used < 1 || h.Used > h.Experts:
		return layout{}, fmt.Errorf("used %d: want 1..experts (%d)", h.Used, h.Experts)
	case h.Embd < 0 || h.Embd > maxEmbd:
		return layout{}, fmt.Errorf("embd %d: want 0..%d", h.Embd, maxEmbd)
	case iw > 0 && h.Embd == 0:
		return layout{}, fmt.Errorf("inputs %s need embd >= 1", h.Inputs)
	}
	for j, l := range h.MoELayers {
		if l < 0 || l >= h.Layers {
			return layout{}, fmt.Errorf("moe_layers[%d] = %d: want 0..%d", j, l, h.Layers-1)
		}
		if j > 0 && l <= h.MoELayers[j-1] {
			return layout{}, fmt.Errorf("moe_layers[%d] = %d: not above moe_layers[%d] = %d", j, l, j-1, h.MoELayers[j-1])
		}
	}
	if h.ModelSHA256 != "" {
		if b, err := hex.DecodeString(h.ModelSHA256); err != nil || len(b) != 32 {
			return layout{}, fmt.Errorf("model_sha256 %q: want 64 hex digits", h.ModelSHA256)
		}
	}
	if h.Fingerprint != "" {
		if b, err := hex.DecodeString(h.Fingerprint); err != nil || len(b) != 32 {
			return layout{}, fmt.Errorf("fingerprint %q: want 64 hex digits", h.Fingerprint)
		}
	}
	if h.Created != "" {
		if _, err := time.Parse(time.RFC3339, h.Created); err != nil {
			return layout{}, fmt.Errorf("created %q: want RFC 3339: %w", h.Created, err)
		}
	}
	lb := 6*h.Used + h.Embd*iw
	if h.Logits {
		lb += 4 * h.Experts
	}
	// The bounds above keep this product below 2^35, so int64 cannot overflow.
	size := 16 + int64(len(h.MoELayers))*int64(lb)
	if size > MaxChunkBytes {
		return layout{}, fmt.Errorf("token record of %d bytes exceeds %d", size, MaxChunkBytes)
	}
	return layout{
		moe: h.MoELayers, experts: h.Experts, used: h.Used, embd: h.Embd,
		inputWidth: iw, logits: h.Logits, layerBytes: lb, tokenSize: int(size),
	}, nil
}

// encodeHeader renders the JSON part of the preamble.
func encodeHeader(h *Header) ([]byte, error) {
	js, err := json.Marshal(h)
	if err != nil {
		return nil, fmt.Errorf("header JSON: %w", err)
	}
	if len(js) > maxHeaderJSON {
		return nil, fmt.Errorf("header JSON of %d bytes exceeds %d", len(js), maxHeaderJSON)
	}
	return js, nil
}
