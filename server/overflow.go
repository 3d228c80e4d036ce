package server

import (
	"net/http"
	"strconv"

	"github.com/commit-run/commit-run/engine"
)

// chatTokens renders a chat with the model's template. A chat that has outgrown the context
// (it leaves less than reserve tokens for the reply, at most an eighth of the context) drops
// its oldest messages after the leading system ones, one at a time, until it fits or only the
// last message is left, as ollama does, so that a long conversation goes on instead of
// failing at every later turn; unless Options.RefuseOverflow. Messages whose bytes alone rule
// out the context go before any rendering (fits). The header X-Context-Trimmed and a metric
// count what was dropped. Whether the result leaves room is the caller's check (room).
func (s *Server) chatTokens(w http.ResponseWriter, msgs []engine.Message, reserve int, co engine.ChatOptions) ([]int32, *reqError) {
	first := 0
	for first < len(msgs) && msgs[first].Role == "system" {
		first++
	}
	trim := !s.opts.RefuseOverflow
	dropped := 0
	drop := func() {
		msgs = append(msgs[:first:first], msgs[first+1:]...)
		dropped++
	}
	defer func() {
		if dropped > 0 {
			w.Header().Set("X-Context-Trimmed", strconv.Itoa(dropped))
			s.met.trimmed.Add(float64(dropped))
		}
	}()
	for trim && first < len(msgs)-1 && s.fits("messages", contentBytes(msgs)) != nil {
		drop()
	}
	if err := s.fits("messages", contentBytes(msgs)); err != nil {
		return nil, err
	}
	ids, err := s.model.ChatTokensWith(msgs, co)
	if err != nil {
		return nil, invalid("messages", "messages: %v", err)
	}
	ctx := s.model.ContextLength()
	reserve = max(1, min(reserve, ctx/8))
	for trim && len(ids)+reserve > ctx && first < len(msgs)-1 {
		drop()
		if ids, err = s.model.ChatTokensWith(msgs, co); err != nil {
			return nil, invalid("messages", "messages: %v", err)
		}
	}
	return ids, nil
}
