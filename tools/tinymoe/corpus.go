package tinymoe

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"unicode/utf8"
)

// HeldOutFraction is the share of the text, from its end, that training never sees.
const HeldOutFraction = 0.10

// textModule and textPath locate War and Peace (public domain) in the module cache: the ollama
// module, which commit-run already depends on, ships it as tokenizer test data.
const (
	textModule = "github.com/ollama/ollama"
	textPath   = "tokenizer/testdata/war-and-peace.txt"
)

// FindText returns the path of War and Peace in the Go module cache, downloading the module
// if needed (go mod download) from the module that contains dir.
func FindText(dir string) (string, error) {
	cmd := exec.Command("go", "mod", "download", "-json", textModule)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("locate %s: go mod download %s: %w", textPath, textModule, err)
	}
	// The JSON has a "Dir" field; a tiny scan avoids a struct for one value.
	const key = `"Dir": "`
	i := bytes.Index(out, []byte(key))
	if i < 0 {
		return "", fmt.Errorf("locate %s: no Dir in go mod download output", textPath)
	}
	rest := out[i+len(key):]
	j := bytes.IndexByte(rest, '"')
	if j < 0 {
		return "", fmt.Errorf("locate %s: malformed go mod download output", textPath)
	}
	p := filepath.Join(string(rest[:j]), filepath.FromSlash(textPath))
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("locate %s: %w", textPath, err)
	}
	return p, nil
}

// Split cuts text into a training part and a held-out part: the held-out part is the last
// HeldOutFraction of the bytes, moved forward to the start of the next line so that no line is
// cut in two.
func Split(text string) (train, heldOut string, err error) {
	if !utf8.ValidString(text) {
		return "", "", fmt.Errorf("split: text is not valid UTF-8")
	}
	cut := int(float64(len(text)) * (1 - HeldOutFraction))
	nl := strings.IndexByte(text[cut:], '\n')
	if nl < 0 {
		return "", "", fmt.Errorf("split: no line break in the last %.0f%% of the text", 100*HeldOutFraction)
	}
	cut += nl + 1
	return text[:cut], text[cut:], nil
}
