package server

import (
	"fmt"
	"net/http"
)

// llama-server's own routes that clients and tools use beside the OpenAI ones: /tokenize,
// /detokenize and /props, with its field names; and commit-run's /experts.

// tokenize is POST /tokenize: {"content", "add_special", "with_pieces"} to {"tokens"}, each an id
// or, with_pieces, {"id", "piece"}.
func (s *Server) tokenize(w http.ResponseWriter, r *http.Request) {
	if !s.loaded(w) {
		return
	}
	var q struct {
		Content    string `json:"content"`
		AddSpecial bool   `json:"add_special"`
		WithPieces bool   `json:"with_pieces"`
	}
	if err := decode(r, &q); err != nil {
		err.write(w)
		return
	}
	ids, err := s.model.Tokenize(q.Content, q.AddSpecial)
	if err != nil {
		invalid("content", "content: %v", err).write(w)
		return
	}
	if !q.WithPieces {
		writeJSON(w, http.StatusOK, map[string]any{"tokens": ids})
		return
	}
	type piece struct {
		ID    int32  `json:"id"`
		Piece string `json:"piece"`
	}
	out := make([]piece, len(ids))
	for i, id := range ids {
		out[i] = piece{id, s.model.Detokenize([]int32{id})}
	}
	writeJSON(w, http.StatusOK, map[string]any{"tokens": out})
}

// detokenize is POST /detokenize: {"tokens"} to {"content"}.
func (s *Server) detokenize(w http.ResponseWriter, r *http.Request) {
	if !s.loaded(w) {
		return
	}
	var q struct {
		Tokens []int32 `json:"tokens"`
	}
	if err := decode(r, &q); err != nil {
		err.write(w)
		return
	}
	vocab := s.model.Info().Vocab
	for i, id := range q.Tokens {
		if id < 0 || int(id) >= vocab {
			invalid("tokens", "tokens[%d]: id %d is not in the vocabulary of %d", i, id, vocab).write(w)
			return
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"content": s.model.Detokenize(q.Tokens)})
}

// props is GET /props: the context, the slots, the model and its chat template, as
// llama-server describes itself to its web UI and to tools.
func (s *Server) props(w http.ResponseWriter, r *http.Request) {
	if !s.loaded(w) {
		return
	}
	info := s.model.Info()
	writeJSON(w, http.StatusOK, map[string]any{
		"default_generation_settings": map[string]any{"n_ctx": s.model.ContextLength(),
			"params": map[string]any{"temperature": 1.0, "top_p": 1.0, "top_k": 0, "n_predict": -1}},
		"total_slots":   s.opts.Parallel,
		"model_path":    info.Path,
		"model_alias":   s.name,
		"chat_template": info.ChatTemplate,
		"modalities":    map[string]bool{"vision": false, "audio": false},
		"build_info":    fmt.Sprintf("commit-run (%s)", info.Architecture),
	})
}

// experts is GET /experts, commit-run's own: where an offloading model's routed experts are
// now (each MoE layer's experts in a device slot), and the cache's counts since the model
// opened, for the chat page's live view. A model that does not offload says so.
func (s *Server) experts(w http.ResponseWriter, r *http.Request) {
	if !s.loaded(w) {
		return
	}
	resident, ok := s.model.ResidentExperts()
	st, _ := s.model.Offload()
	info := s.model.Info()
	type layer struct {
		Layer    int   `json:"layer"`
		Experts  int   `json:"experts"`
		Resident []int `json:"resident"`
	}
	layers := make([]layer, 0, len(info.MoELayers))
	for _, l := range info.MoELayers {
		layers = append(layers, layer{Layer: l, Experts: info.Experts, Resident: append([]int{}, resident[l]...)})
	}
	writeJSON(w, http.StatusOK, map[string]any{"offloading": ok, "slots": st.Slots,
		"hits": st.Hits, "misses": st.Misses, "bytes_copied": st.BytesCopied, "layers": layers})
}
