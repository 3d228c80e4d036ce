package engine

import "fmt"

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
