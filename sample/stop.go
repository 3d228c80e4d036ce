package sample

import "strings"

// Stops holds back generated text that could still become a stop string, so a stop string
// never reaches the caller, and cuts the text where one appears.
type Stops struct {
	stops   []string
	pending string
}

// NewStops watches for the non-empty strings of stops.
func NewStops(stops []string) *Stops {
	var s []string
	for _, x := range stops {
		if x != "" {
			s = append(s, x)
		}
	}
	return &Stops{stops: s}
}

// Push adds text and returns what can be released now, and whether a stop string was hit
// (then the released text is everything before it).
func (m *Stops) Push(text string) (string, bool) {
	if len(m.stops) == 0 {
		return text, false
	}
	m.pending += text
	cut := -1
	for _, s := range m.stops {
		if i := strings.Index(m.pending, s); i >= 0 && (cut < 0 || i < cut) {
			cut = i
		}
	}
	if cut >= 0 {
		out := m.pending[:cut]
		m.pending = ""
		return out, true
	}
	// Keep the longest suffix that is a prefix of some stop string.
	keep := 0
	for _, s := range m.stops {
		for n := min(len(s)-1, len(m.pending)); n > keep; n-- {
			if strings.HasSuffix(m.pending, s[:n]) {
				keep = n
				break
			}
		}
	}
	out := m.pending[:len(m.pending)-keep]
	m.pending = m.pending[len(m.pending)-keep:]
	return out, false
}

// Flush releases whatever is held back.
func (m *Stops) Flush() string {
	out := m.pending
	m.pending = ""
	return out
}
